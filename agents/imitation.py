"""Warm start by imitation: a registered router's episodes as demonstrations for Double DQN.

Near and above capacity a good routing rule is rare enough that epsilon-greedy exploration from
a random network does not find it in the episodes we can afford (the DQN variants lost 21-122%
to round robin there); a rule such as ``late_binding`` already gains 25-70%. So the learner
starts from it: :func:`collect_demonstrations` runs the router in the training env and records
every transition (observation, the router's action in the env's action space, the reward and
discount the learner will see, the next state's mask); ``DoubleDQN.pretrain`` fits the network
to them (TD + DQfD's large margin), and ``DoubleDQN.set_demonstrations`` keeps them in every
later update with a margin weight that decays, so RL fine-tuning starts from the teacher and
may leave it only where the return says it should.

A router's choice is recorded only when the env's action space can express it: a router that
picks a queued request which is not one of the env's candidates (``action.candidates`` /
``order``) is followed, but that step is not a demonstration (the count is reported).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from llm_lb_gym._validate import ConfigError, check_int


@dataclass
class Demonstrations:
    """A teacher's transitions and what it achieved on the same episodes."""

    buffer: object
    """``llm_lb_gym.agents.replay.SemiMDPReplayBuffer`` with the transitions (rewards already scaled)."""
    teacher: str
    episodes: int
    steps: int
    skipped: int
    """Steps whose choice the action space cannot express (followed, not recorded)."""
    metrics: list[dict] = field(default_factory=list)
    """The teacher's episode metrics (``info["metrics"]``)."""
    wall_s: float = 0.0

    @property
    def mean_e2e_s(self) -> float:
        return float(np.mean([m["mean_e2e_s"] for m in self.metrics]))


def collect_demonstrations(env, teacher: str, episodes: int, seed: int, *, reward_scale: float = 1.0,
                           teacher_options: dict | None = None, buffer_size: int | None = None,
                           device: str = "cpu") -> Demonstrations:
    """Run router ``teacher`` on ``env`` (a gymnasium env of ``LLMCluster-v0``) for ``episodes``
    seeded episodes (seeds ``seed``, ``seed + 1``, ...) and record its transitions.

    ``reward_scale`` multiplies the rewards as the training env's scaling does, so the
    demonstrations and the learner's own transitions share units.
    """
    from llm_lb_gym.rollout import make_env_router, router_choice, start_episode, take_choice, watchdog

    from llm_lb_gym.agents.replay import SemiMDPReplayBuffer

    check_int("imitation.episodes", episodes, 1)
    base = env.unwrapped
    router = make_env_router(teacher, base, **(teacher_options or {}))
    if not getattr(base, "action_for", None):
        raise ConfigError("collect_demonstrations needs an LLMCluster-v0 env")
    records: list[tuple] = []
    metrics: list[dict] = []
    skipped = 0
    t0 = time.perf_counter()
    for ep in range(episodes):
        obs, info = start_episode(base, router, seed + ep)
        check = watchdog(base, f"imitation teacher {teacher!r} ({router!r})", seed + ep).check
        while True:
            choice = router_choice(base, router)
            action = base.defer_action if choice is None else base.action_for(*choice)
            # the teacher's choice as it takes it, a hold also where the mask forbids it (step
            # would hand it to action.masked's fallback router): the demonstration is the teacher's
            nxt, r, term, trunc, info = take_choice(base, choice)
            if action is None:   # not expressible in this action space: follow, do not record
                skipped += 1
            else:
                records.append((obs, nxt, action, r * reward_scale, term, info["discount"],
                                info["action_mask"]))
            obs = nxt
            if term or trunc:
                metrics.append(info.get("metrics") or base.metrics())
                break
            check()
    size = buffer_size or max(len(records), 1)
    buf = SemiMDPReplayBuffer(size, base.observation_space, base.action_space, device=device,
                              handle_timeout_termination=False)
    for o, n, a, r, d, disc, mask in records[-size:]:
        buf.add(o[None], n[None], np.array([a]), np.array([r]), np.array([d]),
                [{"discount": disc, "action_mask": mask}])
    return Demonstrations(buf, teacher, episodes, len(records), skipped, metrics,
                          time.perf_counter() - t0)
