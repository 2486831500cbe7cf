"""The agent interface every router agent satisfies, SB3 models included.

Experiments train and evaluate agents without knowing where they come from: a Stable-Baselines3
algorithm (``DQN``, ``DoubleDQN``, ``MaskablePPO``), the hand-written ``REINFORCEAgent``, or a
heuristic wrapped in ``HeuristicAgent``. The :class:`Agent` protocol is the common shape, copied
from SB3's public methods so that SB3 models satisfy it structurally without any adapter.

Action masks are an optional extra: SB3's plain ``DQN`` has no ``action_masks`` argument, while
``DoubleDQN``, ``MaskablePPO`` and the custom agents do. :func:`predict_action` passes the mask
only to agents that accept it, so evaluation code can always hand the env's mask over.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

import numpy as np


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


def accepts_action_masks(agent: Any) -> bool:
    """Whether ``agent.predict`` takes an ``action_masks`` keyword (MaskablePPO, DoubleDQN, ...)."""
    try:
        params = inspect.signature(agent.predict).parameters
    except (TypeError, ValueError):
        return False
    return "action_masks" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def predict_action(
    agent: Any,
    observation: Any,
    action_masks: np.ndarray | None = None,
    deterministic: bool = True,
) -> int:
    """One action for one (non-vectorised) observation, masked when the agent supports it.

    Agents without mask support get the plain call; with the env's usual all-valid mask the
    result is the same, which is why evaluation can use this for every agent alike.
    """
    if action_masks is not None and accepts_action_masks(agent):
        action, _ = agent.predict(
            observation, deterministic=deterministic, action_masks=action_masks
        )
    else:
        action, _ = agent.predict(observation, deterministic=deterministic)
    return int(np.asarray(action).reshape(-1)[0])
