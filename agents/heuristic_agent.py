"""A hand-written routing rule behind the agent interface (:class:`llm_lb_gym.agents.base.Agent`).

:class:`HeuristicAgent` wraps ``policy(obs, info) -> action`` so heuristics run through the same
evaluation code as learned agents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import cloudpickle
import numpy as np

from llm_lb_gym._validate import ConfigError


class HeuristicAgent:
    """A fixed routing rule behind the agent interface: ``policy(obs, info) -> action``.

    ``learn`` is a no-op that runs no training and returns the agent, so training scripts can
    treat heuristics and learned agents alike. ``predict`` passes ``info`` through when given;
    otherwise the policy sees ``{"action_mask": action_masks}`` (or ``{}``). A rule that needs the
    cluster's state rather than the observation can close over the env. ``save`` pickles the
    callable with cloudpickle (lambdas and closures included); load only files you trust.
    """

    def __init__(self, policy: Callable[[Any, Mapping[str, Any]], int]) -> None:
        if not callable(policy):
            raise ConfigError(f"policy={policy!r} must be callable as policy(obs, info) -> action")
        self.policy = policy

    def learn(self, total_timesteps: int, callback: Any = None) -> HeuristicAgent:
        """No training: a heuristic has nothing to learn."""
        return self

    def predict(
        self,
        observation: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = True,
        action_masks: np.ndarray | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> tuple[np.ndarray, None]:
        """The policy's action for one observation; raises if it picks a masked action."""
        if info is None:
            info = {} if action_masks is None else {"action_mask": action_masks}
        action = int(self.policy(observation, info))
        if action_masks is not None and not np.asarray(action_masks, dtype=bool).reshape(-1)[action]:
            raise ValueError(f"heuristic policy chose action {action}, which action_masks marks invalid")
        return np.asarray(action), None

    def save(self, path: str | Path) -> None:
        with open(path, "wb") as f:
            cloudpickle.dump(self.policy, f)

    @classmethod
    def load(cls, path: str | Path, env: Any = None) -> HeuristicAgent:
        with open(path, "rb") as f:
            return cls(cloudpickle.load(f))
