"""Double DQN on top of Stable-Baselines3's DQN, with optional action masking at prediction.

SB3's ``DQN`` bootstraps from ``max_a Q_target(s', a)``, which over-estimates values because the
same noisy network both picks and scores the next action. The paper's router uses Double DQN
(van Hasselt et al., 2016): the online network picks the next action and the target network
scores it,

    y = r + gamma * (1 - done) * Q_target(s', argmax_a Q_online(s', a)).

Only the target changes. ``train`` below is SB3 2.x's ``DQN.train`` line for line (Huber loss,
gradient-norm clipping, n-step discounts, ``train/loss`` and ``train/n_updates`` logging) with the
target factored into :meth:`DoubleDQN._target_q` so tests can check it in isolation. Everything
else (replay buffer, epsilon schedule, target-network sync, save/load) is SB3's.

Masking: in ``LLMCluster-v0`` every action is usually valid (routing with an empty router queue is
a harmless no-op), so training does not mask. ``predict(..., action_masks=...)`` lets evaluation
forbid actions anyway: masked actions get ``-inf`` Q-values and epsilon-exploration samples only
among valid actions, matching ``MaskablePPO.predict``'s signature.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from stable_baselines3 import DQN
from torch.nn import functional as F

from llm_lb_gym._validate import ConfigError


class DoubleDQN(DQN):
    """SB3 ``DQN`` with the Double-DQN target and mask-aware ``predict``.

    Constructor arguments are exactly SB3 ``DQN``'s. For the paper's hyperparameters (64-64 ReLU
    MLP, batch 512, no random exploration after episode 20) build the keywords with
    :func:`agents.paper_defaults.paper_kwargs`.
    """

    def _target_q(
        self,
        next_observations: th.Tensor,
        rewards: th.Tensor,
        dones: th.Tensor,
        discounts: th.Tensor | float | None = None,
    ) -> th.Tensor:
        """Double-DQN TD target, shape ``(batch, 1)``; no gradient flows through it.

        ``discounts`` is gamma (default) or, with SB3's n-step replay, gamma**n per sample;
        ``rewards`` and ``dones`` have shape ``(batch, 1)`` as SB3's replay samples do.
        """
        if discounts is None:
            discounts = self.gamma
        with th.no_grad():
            # Online network selects, target network evaluates.
            next_actions = self.q_net(next_observations).argmax(dim=1, keepdim=True)
            next_q_values = th.gather(self.q_net_target(next_observations), dim=1, index=next_actions)
            return rewards + (1 - dones) * discounts * next_q_values

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        """SB3 ``DQN.train`` with the target replaced by :meth:`_target_q`."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)

        losses = []
        for _ in range(gradient_steps):
            replay_data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)  # type: ignore[union-attr]
            # For n-step replay the per-sample discount is gamma**n (shorter on early termination).
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma
            target_q_values = self._target_q(
                replay_data.next_observations, replay_data.rewards, replay_data.dones, discounts
            )

            current_q_values = self.q_net(replay_data.observations)
            current_q_values = th.gather(current_q_values, dim=1, index=replay_data.actions.long())

            loss = F.smooth_l1_loss(current_q_values, target_q_values)
            losses.append(loss.item())

            self.policy.optimizer.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()

        self._n_updates += gradient_steps

        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))

    def predict(  # type: ignore[override]
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        action_masks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """SB3's epsilon-greedy ``predict``, restricted to ``action_masks`` when given.

        ``action_masks``: booleans of shape ``(n_actions,)`` for one observation or
        ``(n_envs, n_actions)`` for a vectorised one; True marks a valid action.
        """
        if action_masks is None:
            return super().predict(observation, state, episode_start, deterministic)

        obs_tensor, vectorized = self.policy.obs_to_tensor(observation)
        n_batch = next(iter(obs_tensor.values())).shape[0] if isinstance(obs_tensor, dict) else obs_tensor.shape[0]
        masks = self._check_masks(action_masks, n_batch)

        if not deterministic and np.random.rand() < self.exploration_rate:
            # Same global RNG as SB3's exploration, so seeding with ``seed=`` covers both.
            actions = np.array([np.random.choice(np.flatnonzero(row)) for row in masks])
        else:
            self.policy.set_training_mode(False)
            with th.no_grad():
                q_values = self.q_net(obs_tensor)
            q_values = q_values.masked_fill(~th.as_tensor(masks, device=q_values.device), -th.inf)
            actions = q_values.argmax(dim=1).cpu().numpy()

        if not vectorized:
            actions = actions.squeeze(axis=0)
        return actions, state

    def _check_masks(self, action_masks: Any, n_batch: int) -> np.ndarray:
        """Masks as a ``(n_batch, n_actions)`` bool array; errors name the expected shape."""
        n_actions = int(self.action_space.n)  # type: ignore[union-attr]
        masks = np.asarray(action_masks, dtype=bool)
        if masks.size != n_batch * n_actions:
            raise ConfigError(
                f"action_masks has shape {masks.shape}; expected ({n_actions},) or "
                f"({n_batch}, {n_actions}) for this observation"
            )
        masks = masks.reshape(n_batch, n_actions)
        if not masks.any(axis=1).all():
            raise ConfigError("action_masks marks no action valid for some observation")
        return masks
