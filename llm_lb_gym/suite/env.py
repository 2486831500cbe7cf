"""An env whose every episode is a fresh condition: training over a distribution, for RL and imitation.

``ConditionEnv(space)`` is ``LLMCluster-v0`` with a twist at ``reset``: it draws a condition
from a ``ConditionSpace`` (``suite/suites.py``: workload with its training rows, load, predictor
accuracy, cluster) from its own ``np_random`` and plays that condition's episode. An agent
trained on it never sees one world only, and never a held-out row.

Spaces must stay fixed for a learner, so the clusters it draws have one instance count
(``num_instances``; the space's clusters of another size are left out, and it is an error
when none is left) and, when any drawn cluster is mixed, every episode's observation carries
the mixed-cluster features (``speed``, ``kv_size``), so a homogeneous episode has the same shape.
``env_options`` (``obs``, ``action``, ``reward``, ...) apply to every condition. Same seed, same
sequence of conditions and episodes.

Registered as ``gym.make("LLMCluster-Train-v0")`` (the training distribution ``TRAIN``: needs
``../shared/data`` for its traces) and ``gym.make("LLMCluster-TrainSynthetic-v0")`` (its
task-mix part, no data), each with ``num_instances`` and ``env_options`` as keywords.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from .._validate import ConfigError
from ..envs.cluster_env import LLMClusterEnv
from ..envs.observation import MIXED_CLUSTER_FEATURES
from .condition import Condition, missing_data
from .suites import ConditionSpace, get_space


class ConditionEnv(gym.Env):
    """See the module doc."""

    metadata = {"render_modes": []}

    def __init__(self, space: ConditionSpace | str = "train", num_instances: int = 4,
                 env_options: dict | None = None):
        name = space if isinstance(space, str) else "the given space"
        space = get_space(space)
        for w, split, _ in space.workloads:    # up front: a missing dataset, not a failed reset later
            why = missing_data(Condition(w, split))
            if why is not None:
                raise ConfigError(f"ConditionEnv: {name} draws {w}:{split}, which is not here ({why}); "
                                  f"space='train_synthetic' (LLMCluster-TrainSynthetic-v0) needs no data")
        self.space = space.with_instances(num_instances, "ConditionEnv")
        self.env_options = dict(env_options or {})
        for key in ("num_instances", "instances", "engine", "workload", "predictor", "num_requests",
                    "arrival_rate_rps"):
            if key in self.env_options:
                raise ConfigError(f"ConditionEnv: env_options.{key} is set by each condition; allowed: "
                                  "obs, action, reward, slo, decision_interval_s, ...")
        if self.space.mixed:
            obs = dict(self.env_options.get("obs") or {})
            feats = list(obs.get("features") or ())
            obs["features"] = tuple(feats + [f for f in MIXED_CLUSTER_FEATURES if f not in feats])
            self.env_options["obs"] = obs
        self.condition = self.space.sample(np.random.default_rng(0), 1)[0]
        self.env = self._build(self.condition)
        self.episodes = 0      # finished episodes: the guidance weight's k carries across conditions
        self._ended = False
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space

    def _build(self, cond) -> LLMClusterEnv:
        kw = cond.env_kwargs()
        kw.pop("reward", None)             # the condition's baseline reward is for evaluation only
        return LLMClusterEnv(**{**kw, **self.env_options})

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.condition = self.space.sample(self.np_random, 1)[0]
        self.env = self._build(self.condition)
        assert self.env.observation_space == self.observation_space, "every condition observes alike"
        options = dict(options or {})
        if self._ended:         # as LLMClusterEnv: resets with no episode between leave k alone
            self.episodes += 1
            self._ended = False
        options.setdefault("guidance_episode", self.episodes)
        obs, info = self.env.reset(seed=int(self.np_random.integers(2**31)), options=options)
        info["condition"] = self.condition.name
        return obs, info

    def step(self, action):
        out = self.env.step(action)
        if out[2] or out[3]:
            self._ended = True
        return out

    def action_masks(self) -> np.ndarray:
        return self.env.action_masks()

    def metrics(self) -> dict:
        return self.env.metrics()

    def warn_if_truncated(self, max_episode_steps) -> None:
        self.env.warn_if_truncated(max_episode_steps)

    def __getattr__(self, name: str):
        """The current condition's env answers what this one does not hold (``cluster``, ``m``,
        ``cfg``, ...), so wrappers that read the unwrapped env (``RouterRL``, the routers of
        ``make_env_router``) work on it. ``env`` itself is never forwarded (copies and pickles
        look it up before it exists)."""
        if name.startswith("__") or name in ("env", "space", "env_options", "condition"):
            raise AttributeError(name)
        return getattr(self.env, name)
