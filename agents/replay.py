"""Replay for a semi-MDP: each transition keeps its own discount and the next state's mask.

``LLMCluster-v0`` steps take variable simulated time: a routing step at a busy decision time
takes none, a defer one decision interval, a fast-forward or the final drain many. A constant
per-step gamma is then not a horizon (at about one step per request, gamma = 0.99 looks 1-5 s
ahead near capacity while a routing decision's effect lasts tens of seconds) and it charges
zero-time routing steps a discount that deferring through the same time does not pay. The env
reports the right factor for every transition in ``info["discount"]`` (gamma_s ** dt under
``reward.discount=semi_mdp``, with the penalty inside the step already discounted interval by
interval); this buffer stores it, so the learner's target is

    y = r + (1 - done) * discount * Q_target(s', argmax_{a valid in s'} Q_online(s', a)).

The next state's action mask (``info["action_mask"]``) is kept too: with k candidate requests
most routing actions can be invalid (a slot with no request), and bootstrapping from an invalid
action's value would feed the learner values of actions it can never take.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer

from llm_lb_gym._validate import ConfigError


class SemiMDPSamples(NamedTuple):
    observations: th.Tensor
    actions: th.Tensor
    next_observations: th.Tensor
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor
    """(batch, 1): the bootstrap factor of each transition."""
    next_masks: th.Tensor
    """(batch, n_actions) bool: actions valid in the next state."""


class SemiMDPReplayBuffer(ReplayBuffer):
    """SB3 ``ReplayBuffer`` that also stores ``info["discount"]`` and ``info["action_mask"]``.

    Both keys are required: a transition without its discount would silently fall back to a
    horizon nobody chose, so a missing key is an error naming the env option that provides it.
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True):
        if not isinstance(action_space, spaces.Discrete):
            raise ConfigError(f"SemiMDPReplayBuffer needs a Discrete action space, got {action_space}")
        super().__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs,
                         optimize_memory_usage=optimize_memory_usage,
                         handle_timeout_termination=handle_timeout_termination)
        self.n_actions = int(action_space.n)
        self.discounts = np.zeros((self.buffer_size, self.n_envs), dtype=np.float32)
        self.next_masks = np.ones((self.buffer_size, self.n_envs, self.n_actions), dtype=bool)

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        pos = self.pos
        for i, info in enumerate(infos):
            try:
                self.discounts[pos, i] = info["discount"]
            except KeyError:
                raise ConfigError("SemiMDPReplayBuffer: the env's info has no 'discount' (it comes "
                                  "from LLMCluster-v0, reward.discount=semi_mdp|per_step)") from None
            mask = info.get("action_mask")
            self.next_masks[pos, i] = True if mask is None else mask
        super().add(obs, next_obs, action, reward, done, infos)

    def _get_samples(self, batch_inds: np.ndarray, env=None) -> SemiMDPSamples:
        env_indices = np.random.randint(0, high=self.n_envs, size=(len(batch_inds),))
        if self.optimize_memory_usage:
            next_obs = self.observations[(batch_inds + 1) % self.buffer_size, env_indices, :]
        else:
            next_obs = self.next_observations[batch_inds, env_indices, :]
        dones = self.dones[batch_inds, env_indices] * (1 - self.timeouts[batch_inds, env_indices])
        return SemiMDPSamples(
            self.to_torch(self._normalize_obs(self.observations[batch_inds, env_indices, :], env)),
            self.to_torch(self.actions[batch_inds, env_indices, :]),
            self.to_torch(self._normalize_obs(next_obs, env)),
            self.to_torch(dones.reshape(-1, 1)),
            self.to_torch(self._normalize_reward(self.rewards[batch_inds, env_indices].reshape(-1, 1), env)),
            self.to_torch(self.discounts[batch_inds, env_indices].reshape(-1, 1)),
            th.as_tensor(self.next_masks[batch_inds, env_indices], device=self.device),
        )


def join_samples(replay, demo, gamma: float):
    """One batch of ``replay`` then ``demo`` samples (SB3 ``ReplayBufferSamples`` or
    :class:`SemiMDPSamples`): a missing discount is ``gamma``, a missing next mask all-valid, so
    both parts can be joined whatever buffer they came from (``DoubleDQN._update_loss``)."""

    def discounts(d):
        x = getattr(d, "discounts", None)
        return x if x is not None else th.full_like(d.rewards, gamma)

    def masks(d):
        x = getattr(d, "next_masks", None)
        return x if x is not None else th.ones(d.rewards.shape[0], n_actions, dtype=th.bool, device=d.rewards.device)

    given = [getattr(d, "next_masks", None) for d in (replay, demo)]
    n_actions = next((m.shape[1] for m in given if m is not None), 0)
    return SemiMDPSamples(
        th.cat([replay.observations, demo.observations]),
        th.cat([replay.actions, demo.actions]),
        th.cat([replay.next_observations, demo.next_observations]),
        th.cat([replay.dones, demo.dones]),
        th.cat([replay.rewards, demo.rewards]),
        th.cat([discounts(replay), discounts(demo)]),
        th.cat([masks(replay), masks(demo)]) if n_actions else None,
    )
