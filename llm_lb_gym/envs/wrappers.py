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

    def reset(self, **kwargs):
        out = self.env.reset(**kwargs)
        self.env.unwrapped.warn_if_truncated(getattr(self.spec, "max_episode_steps", None))
        return out

    def step(self, action):
        # Every step passes here: the tuple goes back as it came (no unpacking, no new tuple).
        out = self.env.step(action)
        if out[3] and out[4].get("metrics") is None:   # truncated, and the env did not end it
            out[4]["metrics"] = self.env.unwrapped.metrics()
        return out


# ------------------------------------------------------------------ for any framework's agents
DISCOUNTS = ("survival", "none")
AUTO = "auto"


def round_robin_returns(env, seed: int) -> dict[str, float]:
    """One round-robin episode on ``env`` (an ``LLMClusterEnv``, reset with ``seed``): its steps,
    the mean and standard deviation over its steps of the discounted return-to-go (each
    transition discounted by its ``info["discount"]``, the quantity a learner's values estimate)
    and its makespan. The one definition of the reward scale: ``llm-lb-gym train``'s
    ``train.reward_scale: auto`` (``experiments/_training.py``) and ``RouterRL`` use it."""
    import numpy as np

    from ..routers.drive import decide, router_rng
    from ..sim.watchdog import Watchdog
    from .router_factory import make_env_router

    # The episode as llm_lb_gym.rollout drives a router (rollout sits above the env layer).
    env = env.unwrapped
    router = make_env_router("round_robin", env)
    env.reset(seed=seed)
    router.reset(router_rng(seed), env.m)
    check = Watchdog(env.cluster, f"round robin (the reward scale's reference episode) on seed {seed}").check
    rewards, discounts = [], []
    while True:
        choice = decide(env.cluster, router) if env.cluster.queue else None
        _, r, term, trunc, info = env.route_step(env.m) if choice is None else env.route_step(choice[1], choice[0])
        rewards.append(r)
        discounts.append(info["discount"])
        if term or trunc:
            break
        check()
    returns = np.empty(len(rewards))
    g = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = rewards[t] + (discounts[t] * g if t < len(rewards) - 1 else 0.0)
        returns[t] = g
    return {"steps": len(rewards), "return_mean": float(returns.mean()),
            "return_std": float(returns.std()), "makespan_s": float(env.cluster.t)}


def reward_scale_of(stats: dict[str, float]) -> float:
    """The reward scale from ``round_robin_returns``'s figures: 1 / the return-to-go's spread."""
    return 1.0 / max(stats["return_std"], 1e-12)


class RouterRL(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """``LLMCluster-*`` for a stock agent of any framework (SB3, CleanRL, Tianshou, TorchRL):
    rewards at O(1), the semi-MDP discount folded so one constant gamma (1.0) optimises the
    env's documented discounted return, and the action mask as int8.

    **Reward scale.** The reward sums over every request in the system, so its size depends on
    the load by orders of magnitude (hundreds per step near capacity, returns of 1e3-1e5).
    ``reward_scale="auto"`` multiplies it by 1 / the standard deviation of round robin's
    discounted return-to-go on one episode of the same env (seed ``scale_seed``, on a copy, so the
    wrapped env's own episodes are untouched): the learner's values then vary by O(1) between
    states, in every regime, as the project's own agents train (``round_robin_returns``). The
    scale is fixed, not a running normaliser, and nothing is clipped: one step (a drain) can
    carry most of an episode's penalty. ``value_offset`` is round robin's mean scaled
    return-to-go: values would sit there, several spreads from 0, which a network with a
    default initialisation spends tens of thousands of updates reaching. With ``center`` (and the
    survival discount) the wrapper subtracts it from the reward of each step that ends an
    episode: potential-based shaping with a constant potential (Ng et al. 1999), so every
    state's value moves by the same ``-value_offset`` to about 0 and the best policy is unchanged.

    **Discount.** Steps take variable simulated time (a routing step none, a defer one interval,
    a drain many), and the env's return discounts each transition by its own ``info["discount"]``
    (gamma_s ** dt). A stock algorithm has one gamma per step. ``discount="survival"`` folds
    the per-transition discount into the episode's end: after each step the wrapper ends the
    episode (``terminated``, value 0 beyond it) with probability ``1 - info["discount"]``, and the
    agent must use ``gamma=1.0``. The expected return from any state is then exactly the env's
    discounted return (a discount is a survival probability), whatever the algorithm. Such an
    end is virtual: the next ``reset()`` (without a seed or options) continues the same
    simulated episode from where it stopped, so the agent still sees every stretch of traffic,
    not only episode starts; ``info["survival_end"]`` marks it, ``info["metrics"]`` still
    comes at the real end only. Trade-offs: the returns the agent samples are noisier than the
    expectation (a 30 s horizon ends a virtual episode every ~1,500 defers); the episode returns a
    framework logs (Monitor's ``ep_rew_mean``) are of virtual episodes; and an agent with
    gamma < 1 discounts twice. ``discount="none"`` passes ``terminated`` through: the agent's
    own constant gamma then discounts per step, which is a different objective (routing steps
    take no time) -- the route the paper took.

    **Masks.** ``info["action_mask"]`` and ``action_masks()`` are int8 (the env's own dtype), as
    ``action_space.sample(mask=...)`` wants; agents that ignore the mask are safe (masked actions
    go to the env's fallback router).
    """

    def __init__(self, env: gym.Env, reward_scale: float | str = AUTO, discount: str = "survival",
                 scale_seed: int = 0, center: bool = True):
        import copy

        from .._validate import ConfigError, check_choice, check_int

        gym.utils.RecordConstructorArgs.__init__(self, reward_scale=reward_scale, discount=discount,
                                                 scale_seed=scale_seed, center=center)
        gym.Wrapper.__init__(self, env)
        check_choice("RouterRL discount", discount, DISCOUNTS)
        check_int("RouterRL scale_seed", scale_seed, 0, 2**63 - 1)
        self.discount = discount
        self.stats = None
        if reward_scale == AUTO:
            self.stats = round_robin_returns(copy.deepcopy(env.unwrapped), scale_seed)
            reward_scale = reward_scale_of(self.stats)
        elif isinstance(reward_scale, bool) or not isinstance(reward_scale, (int, float)) \
                or not 0.0 < float(reward_scale) < float("inf"):
            raise ConfigError(f"RouterRL reward_scale={reward_scale!r}; allowed: 'auto' or a number > 0")
        self.reward_scale = float(reward_scale)
        """What every reward is multiplied by."""
        self.value_offset = (self.stats["return_mean"] * self.reward_scale
                             if self.stats is not None else None)
        """Round robin's mean scaled return-to-go (``reward_scale="auto"`` only)."""
        from .._validate import check_bool

        check_bool("RouterRL center", center)
        self.center = center and discount == "survival" and self.value_offset is not None
        """Subtract ``value_offset`` from the reward of every step that ends an episode."""
        self._rng = None
        self._carry = None   # (obs, info) where a virtual episode end left the real one

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        import numpy as np

        if self._carry is not None and seed is None and options is None:
            obs, info = self._carry   # a virtual end: the same simulated episode goes on
            self._carry = None
            return obs, info
        self._carry = None
        obs, info = self.env.reset(seed=seed, options=options)
        if seed is not None or self._rng is None:
            # The ends' own stream, from the episode's seed (the env's stream is untouched).
            self._rng = np.random.default_rng(None if seed is None else [seed, 0x5EED])
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        reward = float(reward) * self.reward_scale
        if self.discount == "survival" and not (terminated or truncated):
            if self._rng.random() >= info["discount"]:
                info["survival_end"] = True
                self._carry = (obs, info)
                terminated = True
        if terminated and self.center:
            reward -= self.value_offset
        return obs, reward, terminated, truncated, info

    def action_masks(self):
        return self.env.unwrapped.action_masks()
