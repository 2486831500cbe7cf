"""The agent interface every router agent satisfies, SB3 models included.

Experiments train and evaluate agents without knowing where they come from: a Stable-Baselines3
algorithm (``DQN``, ``DoubleDQN``, ``MaskablePPO``), the hand-written ``REINFORCEAgent``, or a
heuristic wrapped in ``HeuristicAgent``. The :class:`Agent` protocol is the common shape, copied
from SB3's public methods so that SB3 models satisfy it structurally without any adapter.

Action masks are an optional extra: SB3's plain ``DQN`` has no ``action_masks`` argument, while
``DoubleDQN``, ``MaskablePPO`` and the custom agents do. :func:`predict_action` passes the mask
only to agents that accept it, so evaluation code can always hand the env's mask over. It and
:func:`accepts_action_masks` are defined in :mod:`llm_lb_gym.rollout` (the package's episode
runner needs them and must not import this package) and re-exported here.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from llm_lb_gym.rollout import accepts_action_masks, predict_action

__all__ = ["Agent", "accepts_action_masks", "predict_action"]


@runtime_checkable
class Agent(Protocol):
    """What an experiment needs from an agent (SB3's ``BaseAlgorithm`` signature subset)."""

    def learn(self, total_timesteps: int, callback: Any = None) -> Any:
        """Train for ``total_timesteps`` environment steps; return the agent."""

    def predict(
        self,
        observation: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, Any]:
        """Return ``(action, next_state)``; ``state`` is for recurrent policies (else None)."""

    def save(self, path: Any) -> None:
        """Write the agent to ``path`` so that ``load`` can restore it."""

    @classmethod
    def load(cls, path: Any, env: Any = None) -> Any:
        """Restore an agent written by ``save``; ``env`` is needed only to continue training."""
