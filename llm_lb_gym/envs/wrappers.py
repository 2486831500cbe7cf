"""``FinalMetrics``: the episode metrics in ``info["metrics"]`` at every episode end.

The env puts them there when it terminates (every request finished or rejected). Truncation
comes from Gymnasium's ``TimeLimit``, which the env never sees (``gym.make`` gives the env a
spec without ``max_episode_steps``), so a wrapper outside ``TimeLimit`` adds them when it cuts
an episode; ``info["metrics"]["unfinished"]`` then counts the requests still in the system.
The registration lists it in ``additional_wrappers``, which ``gym.make`` applies after
``TimeLimit``, so it also sees a ``gym.make(..., max_episode_steps=N)`` limit. For a hand-built
stack wrap the same way: ``FinalMetrics(TimeLimit(LLMClusterEnv(), N))``.
"""

from __future__ import annotations

import gymnasium as gym


class FinalMetrics(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Add ``info["metrics"]`` (``env.unwrapped.metrics()``) to a truncated step's info."""

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def step(self, action):
        # Every step passes here: the tuple goes back as it came (no unpacking, no new tuple).
        out = self.env.step(action)
        if out[3] and out[4].get("metrics") is None:   # truncated, and the env did not end it
            out[4]["metrics"] = self.env.unwrapped.metrics()
        return out
