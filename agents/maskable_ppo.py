"""MaskablePPO whose advantages discount each transition by its own factor (semi-MDP GAE).

``LLMCluster-v0`` discounts in simulated time: each step reports ``info["discount"]`` (gamma_s **
dt for a step of dt simulated seconds under ``reward.discount=semi_mdp``; ``reward.gamma`` under
``per_step``), and the reward inside a step is already discounted interval by interval. A learner
that discounts 0.99 per step instead optimises another objective: at about one step per
request, 0.99 per step looks a few seconds ahead near capacity and charges a zero-time routing
step the discount a 100 s drain pays. sb3-contrib's ``MaskablePPO`` has one ``gamma``; here its
rollout buffer keeps each step's discount d_t and GAE uses it:

    delta_t = r_t + d_t (1 - done_t) V(s_{t+1}) - V(s_t),
    A_t     = delta_t + d_t lambda (1 - done_t) A_{t+1},

which is SB3's formula with gamma replaced by d_t (equal to it, bit for bit, when every d_t is
gamma; tested). A transition whose ``info`` has no ``"discount"`` (any other env) is discounted
by ``gamma``, so on other envs this is ``MaskablePPO`` unchanged. A rollout buffer that cannot
keep per-step discounts (a ``rollout_buffer_class`` of the user's) is refused as soon as the env
reports a discount other than ``gamma``: the error names the env setting that would make the
two agree.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.buffers import MaskableDictRolloutBuffer, MaskableRolloutBuffer
from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported
from stable_baselines3.common.utils import obs_as_tensor

from llm_lb_gym._validate import ConfigError


class _PerStepDiscounts:
    """Rollout-buffer mixin: ``add(..., discounts=)`` keeps d_t; GAE uses it (module docstring)."""

    discounts: np.ndarray

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        # float64: gamma * gae_lambda is formed in double precision as SB3 forms it from floats.
        self.discounts = np.full((self.buffer_size, self.n_envs), self.gamma, dtype=np.float64)

    def add(self, *args: Any, discounts: np.ndarray | None = None, **kwargs: Any) -> None:
        if discounts is not None:
            self.discounts[self.pos] = discounts
        super().add(*args, **kwargs)  # type: ignore[misc]

    def compute_returns_and_advantage(self, last_values: th.Tensor, dones: np.ndarray) -> None:
        """SB3's ``RolloutBuffer.compute_returns_and_advantage`` with gamma -> ``discounts[step]``."""
        last_values = last_values.clone().cpu().numpy().flatten()
        last_gae_lam = 0
        for step in reversed(range(self.buffer_size)):
            if step == self.buffer_size - 1:
                next_non_terminal = 1.0 - dones.astype(np.float32)
                next_values = last_values
            else:
                next_non_terminal = 1.0 - self.episode_starts[step + 1]
                next_values = self.values[step + 1]
            d = self.discounts[step]
            delta = self.rewards[step] + d.astype(np.float32) * next_values * next_non_terminal - self.values[step]
            last_gae_lam = delta + (d * self.gae_lambda).astype(np.float32) * next_non_terminal * last_gae_lam
            self.advantages[step] = last_gae_lam
        self.returns = self.advantages + self.values


class SemiMDPRolloutBuffer(_PerStepDiscounts, MaskableRolloutBuffer):
    """``MaskableRolloutBuffer`` with per-step discounts."""


class SemiMDPDictRolloutBuffer(_PerStepDiscounts, MaskableDictRolloutBuffer):
    """``MaskableDictRolloutBuffer`` with per-step discounts."""


def step_discounts(infos: list[dict], gamma: float) -> np.ndarray:
    """Each env's discount of this step: ``info["discount"]``, else ``gamma``."""
    return np.array([info.get("discount", gamma) for info in infos], dtype=np.float64)


class SemiMDPMaskablePPO(MaskablePPO):
    """``MaskablePPO`` (same arguments) with per-transition discounts (module docstring)."""

    def _setup_model(self) -> None:
        if self.rollout_buffer_class is None:
            self.rollout_buffer_class = (SemiMDPDictRolloutBuffer if isinstance(self.observation_space, spaces.Dict)
                                         else SemiMDPRolloutBuffer)
        super()._setup_model()

    def _check_discounts(self, discounts: np.ndarray, rollout_buffer) -> None:
        if isinstance(rollout_buffer, _PerStepDiscounts) or np.allclose(discounts, self.gamma, rtol=0, atol=1e-7):
            return
        raise ConfigError(
            f"maskable_ppo: the env discounts this step by {float(discounts.max()):.6g} (info['discount']), "
            f"its gamma is {self.gamma:g}, and rollout_buffer_class="
            f"{type(rollout_buffer).__name__} keeps one gamma; use the default buffer "
            "(llm_lb_gym.agents.maskable_ppo.SemiMDPRolloutBuffer), or make the env's discount constant and "
            f"equal: reward.discount=per_step with reward.gamma={self.gamma:g}")

    def _before_act(self, env) -> dict:
        """Extra keywords for ``rollout_buffer.add`` read from ``env`` before the agent acts
        (none here; ``llm_lb_gym.agents.teacher_kl_ppo`` stores the teacher's action)."""
        return {}

    def collect_rollouts(self, env, callback, rollout_buffer, n_rollout_steps: int, use_masking: bool = True) -> bool:
        """sb3-contrib 2.x's ``MaskablePPO.collect_rollouts`` line for line, except that each step's
        discounts go into the buffer and a time-limit bootstrap uses the step's own discount."""
        assert isinstance(rollout_buffer, (MaskableRolloutBuffer, MaskableDictRolloutBuffer)), \
            "RolloutBuffer doesn't support action masking"
        assert self._last_obs is not None, "No previous observation was provided"
        self.policy.set_training_mode(False)
        n_steps = 0
        action_masks = None
        rollout_buffer.reset()
        if use_masking and not is_masking_supported(env):
            raise ValueError("Environment does not support action masking. Consider using ActionMasker wrapper")
        callback.on_rollout_start()

        while n_steps < n_rollout_steps:
            with th.no_grad():
                obs_tensor = obs_as_tensor(self._last_obs, self.device)  # type: ignore[arg-type]
                if use_masking:
                    action_masks = get_action_masks(env)
                before = self._before_act(env)
                actions, values, log_probs = self.policy(obs_tensor, action_masks=action_masks)
            actions = actions.cpu().numpy()
            new_obs, rewards, dones, infos = env.step(actions)
            discounts = step_discounts(infos, self.gamma)
            self._check_discounts(discounts, rollout_buffer)

            self.num_timesteps += env.num_envs
            callback.update_locals(locals())
            if not callback.on_step():
                return False
            self._update_info_buffer(infos, dones)
            n_steps += 1
            if isinstance(self.action_space, spaces.Discrete):
                actions = actions.reshape(-1, 1)

            # A time limit is not the end of the task: bootstrap from the value of the state it
            # cut, discounted like the step that reached it.
            for idx, done in enumerate(dones):
                if (done and infos[idx].get("terminal_observation") is not None
                        and infos[idx].get("TimeLimit.truncated", False)):
                    terminal_obs = self.policy.obs_to_tensor(infos[idx]["terminal_observation"])[0]
                    with th.no_grad():
                        terminal_value = self.policy.predict_values(terminal_obs)[0]
                    rewards[idx] += discounts[idx] * terminal_value

            extra = {"discounts": discounts} if isinstance(rollout_buffer, _PerStepDiscounts) else {}
            extra.update(before)
            rollout_buffer.add(self._last_obs, actions, rewards, self._last_episode_starts, values, log_probs,
                               action_masks=action_masks, **extra)
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_episode_starts = dones

        with th.no_grad():
            values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))  # type: ignore[arg-type]
        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        callback.on_rollout_end()
        return True


__all__ = ["SemiMDPMaskablePPO", "SemiMDPRolloutBuffer", "SemiMDPDictRolloutBuffer", "step_discounts"]
