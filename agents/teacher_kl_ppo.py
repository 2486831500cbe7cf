"""PPO fine-tuning with a KL penalty to a router teacher (issue 20, the second route).

The learner is ``SemiMDPMaskablePPO`` (per-transition discounts in simulated time) with the
equivariant actor-critic. Two additions:

- :class:`TeacherAction`, an env wrapper, knows the action a router (``late_binding`` with the
  setting's options) would take in the env's current state: ``teacher_action()`` returns that
  env action index, or -1 where the action space cannot express it (a queued request outside
  the candidates) or the mask forbids it (a hold on an idle cluster); ``reset`` and ``step``
  also put it, for the state they return, in ``info["teacher_action"]``. The teacher's choice
  is the one ``llm_lb_gym.agents.policy_iteration`` maps (``router_choice`` then ``env.action_for``).
- :class:`TeacherKLMaskablePPO` reads the teacher's action before it acts (``env_method``, so
  any VecEnv works), keeps a_T in the rollout buffer next to the discounts, and adds to PPO's
  loss ``coef * mean(-log pi(a_T | s))`` over the steps with a_T >= 0: for a deterministic
  teacher KL(pi_T || pi) = -log pi(a_T | s). ``coef`` goes linearly from ``teacher_kl_coef``
  to ``teacher_kl_final`` over training. Warm start: ``bc_epochs`` passes of the same
  cross-entropy alone over the first rollout's states before the first PPO update.

With ``teacher_kl_coef=teacher_kl_final=0`` and ``bc_epochs=0`` the update is
``SemiMDPMaskablePPO``'s exactly (tested).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.utils import explained_variance
from torch.nn import functional as F

from llm_lb_gym._validate import ConfigError, check_int, check_range

from llm_lb_gym.agents.maskable_ppo import SemiMDPDictRolloutBuffer, SemiMDPMaskablePPO, SemiMDPRolloutBuffer


class TeacherAction(gym.Wrapper):
    """``LLMCluster-v0`` with the teacher router's action in each state (module docstring)."""

    def __init__(self, env: gym.Env, teacher: str = "late_binding", teacher_options: dict | None = None):
        from llm_lb_gym.rollout import make_env_router

        super().__init__(env)
        base = env.unwrapped
        if not hasattr(base, "action_for"):
            raise ConfigError("TeacherAction needs an LLMCluster-v0 env")
        self.teacher = teacher
        self.teacher_options = dict(teacher_options or {})
        self.router = make_env_router(teacher, base, **self.teacher_options)
        self._cluster = None

    def teacher_action(self) -> int:
        """The env action index of the teacher's choice now; -1 where it cannot be taken."""
        from llm_lb_gym.rollout import router_choice

        env = self.env.unwrapped
        if env.cluster is not self._cluster:   # a new episode: the router starts afresh
            self._cluster = env.cluster
            self.router.reset(np.random.default_rng(0), env.m)
        choice = router_choice(env, self.router)
        a = env.defer_action if choice is None else env.action_for(*choice)
        if a is None or not env.action_masks()[a]:
            return -1
        return int(a)

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        info["teacher_action"] = self.teacher_action()
        return obs, info

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        info["teacher_action"] = -1 if (term or trunc) else self.teacher_action()
        return obs, r, term, trunc, info


class _TeacherActions:
    """Rollout-buffer mixin: ``add(..., teacher_actions=)`` keeps a_T (-1: none)."""

    teacher_actions: np.ndarray

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        self.teacher_actions = np.full((self.buffer_size, self.n_envs), -1, dtype=np.int64)

    def add(self, *args: Any, teacher_actions: np.ndarray | None = None, **kwargs: Any) -> None:
        if teacher_actions is not None:
            self.teacher_actions[self.pos] = teacher_actions
        super().add(*args, **kwargs)  # type: ignore[misc]

    def get(self, batch_size: int | None = None):
        """SB3's ``get`` (same shuffling, same RNG draws); each batch is (samples, a_T)."""
        if not self.generator_ready:   # SB3 flattens (steps, envs) the same way
            self._flat_teacher = self.swap_and_flatten(self.teacher_actions[..., None]).reshape(-1)
        yield from super().get(batch_size)  # type: ignore[misc]

    def _get_samples(self, batch_inds: np.ndarray, env=None):
        return (super()._get_samples(batch_inds, env),  # type: ignore[misc]
                th.as_tensor(self._flat_teacher[batch_inds], device=self.device))


class TeacherRolloutBuffer(_TeacherActions, SemiMDPRolloutBuffer):
    """``SemiMDPRolloutBuffer`` with the teacher's action of each step."""


class TeacherDictRolloutBuffer(_TeacherActions, SemiMDPDictRolloutBuffer):
    """``SemiMDPDictRolloutBuffer`` with the teacher's action of each step."""


def teacher_nll(policy, observations, action_masks, teacher: th.Tensor) -> th.Tensor | None:
    """mean over steps with a_T >= 0 of -log pi(a_T | s) (= KL(pi_T || pi) for a deterministic
    teacher); None when no step has a teacher action."""
    keep = teacher >= 0
    if not bool(keep.any()):
        return None
    obs = observations[keep] if not isinstance(observations, dict) else {k: v[keep] for k, v in observations.items()}
    masks = None if action_masks is None else action_masks[keep]
    dist = policy.get_distribution(obs, action_masks=masks)
    return -dist.log_prob(teacher[keep]).mean()


class TeacherKLMaskablePPO(SemiMDPMaskablePPO):
    """``SemiMDPMaskablePPO`` plus ``teacher_kl_coef * KL(teacher || pi)`` (module docstring).

    Args (besides MaskablePPO's):
        teacher_kl_coef: the penalty's weight at the start of training (>= 0).
        teacher_kl_final: its weight at the end (linear in between); None: ``teacher_kl_coef``.
        bc_epochs: passes of the cross-entropy alone over the first rollout (warm start).
    """

    def __init__(self, policy, env, *, teacher_kl_coef: float = 1.0, teacher_kl_final: float | None = None,
                 bc_epochs: int = 0, **kwargs: Any):
        check_range("maskable_ppo_kl.teacher_kl_coef", teacher_kl_coef, 0.0)
        if teacher_kl_final is not None:
            check_range("maskable_ppo_kl.teacher_kl_final", teacher_kl_final, 0.0)
        check_int("maskable_ppo_kl.bc_epochs", bc_epochs, 0)
        self.teacher_kl_coef = float(teacher_kl_coef)
        self.teacher_kl_final = float(teacher_kl_coef if teacher_kl_final is None else teacher_kl_final)
        self.bc_epochs = int(bc_epochs)
        self._bc_done = False
        super().__init__(policy, env, **kwargs)

    def _setup_model(self) -> None:
        if self.rollout_buffer_class is None:
            self.rollout_buffer_class = (TeacherDictRolloutBuffer if isinstance(self.observation_space, spaces.Dict)
                                         else TeacherRolloutBuffer)
        super()._setup_model()

    def _before_act(self, env) -> dict:
        try:
            actions = env.env_method("teacher_action")
        except AttributeError as err:
            raise ConfigError("maskable_ppo_kl needs envs wrapped in llm_lb_gym.agents.teacher_kl_ppo.TeacherAction "
                              "(llm_lb_gym.experiments.train does it from train.imitation.teacher)") from err
        return {"teacher_actions": np.asarray(actions, dtype=np.int64)}

    def current_kl_coef(self) -> float:
        """The penalty's weight now (linear from ``teacher_kl_coef`` to ``teacher_kl_final``)."""
        done = 1.0 - float(self._current_progress_remaining)
        return self.teacher_kl_coef + (self.teacher_kl_final - self.teacher_kl_coef) * done

    def behaviour_clone(self, epochs: int) -> float:
        """``epochs`` passes of -log pi(a_T | s) alone over the rollout buffer; the last loss."""
        self.policy.set_training_mode(True)
        last = float("nan")
        for _ in range(epochs):
            for data, teacher in self.rollout_buffer.get(self.batch_size):
                loss = teacher_nll(self.policy, data.observations, data.action_masks, teacher)
                if loss is None:
                    continue
                self.policy.optimizer.zero_grad()
                loss.backward()
                th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                self.policy.optimizer.step()
                last = loss.item()
        return last

    def train(self) -> None:
        """sb3-contrib 2.x's ``MaskablePPO.train`` line for line, plus the teacher KL term."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        if self.bc_epochs and not self._bc_done:
            self._bc_done = True
            self.logger.record("train/bc_loss", self.behaviour_clone(self.bc_epochs))
            self.policy.set_training_mode(True)
        clip_range = self.clip_range(self._current_progress_remaining)  # type: ignore[operator]
        if self.clip_range_vf is not None:
            clip_range_vf = self.clip_range_vf(self._current_progress_remaining)  # type: ignore[operator]
        kl_coef = self.current_kl_coef()

        entropy_losses, pg_losses, value_losses, clip_fractions, teacher_losses = [], [], [], [], []
        continue_training = True
        for epoch in range(self.n_epochs):
            approx_kl_divs = []
            for rollout_data, teacher in self.rollout_buffer.get(self.batch_size):
                actions = rollout_data.actions
                if isinstance(self.action_space, spaces.Discrete):
                    actions = rollout_data.actions.long().flatten()
                values, log_prob, entropy = self.policy.evaluate_actions(
                    rollout_data.observations, actions, action_masks=rollout_data.action_masks)
                values = values.flatten()
                advantages = rollout_data.advantages
                if self.normalize_advantage:
                    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
                ratio = th.exp(log_prob - rollout_data.old_log_prob)
                policy_loss_1 = advantages * ratio
                policy_loss_2 = advantages * th.clamp(ratio, 1 - clip_range, 1 + clip_range)
                policy_loss = -th.min(policy_loss_1, policy_loss_2).mean()
                pg_losses.append(policy_loss.item())
                clip_fractions.append(th.mean((th.abs(ratio - 1) > clip_range).float()).item())
                if self.clip_range_vf is None:
                    values_pred = values
                else:
                    values_pred = rollout_data.old_values + th.clamp(
                        values - rollout_data.old_values, -clip_range_vf, clip_range_vf)
                value_loss = F.mse_loss(rollout_data.returns, values_pred)
                value_losses.append(value_loss.item())
                entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
                entropy_losses.append(entropy_loss.item())

                loss = policy_loss + self.ent_coef * entropy_loss + self.vf_coef * value_loss
                if kl_coef > 0:
                    t_loss = teacher_nll(self.policy, rollout_data.observations, rollout_data.action_masks, teacher)
                    if t_loss is not None:
                        loss = loss + kl_coef * t_loss
                        teacher_losses.append(t_loss.item())

                with th.no_grad():
                    log_ratio = log_prob - rollout_data.old_log_prob
                    approx_kl_div = th.mean((th.exp(log_ratio) - 1) - log_ratio).cpu().numpy()
                    approx_kl_divs.append(approx_kl_div)
                if self.target_kl is not None and approx_kl_div > 1.5 * self.target_kl:
                    continue_training = False
                    break
                self.policy.optimizer.zero_grad()
                loss.backward()
                th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                self.policy.optimizer.step()
            self._n_updates += 1
            if not continue_training:
                break
        explained_var = explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
        self.logger.record("train/entropy_loss", np.mean(entropy_losses))
        self.logger.record("train/policy_gradient_loss", np.mean(pg_losses))
        self.logger.record("train/value_loss", np.mean(value_losses))
        self.logger.record("train/approx_kl", np.mean(approx_kl_divs))
        self.logger.record("train/clip_fraction", np.mean(clip_fractions))
        self.logger.record("train/loss", loss.item())
        self.logger.record("train/explained_variance", explained_var)
        self.logger.record("train/teacher_kl_coef", kl_coef)
        if teacher_losses:
            self.logger.record("train/teacher_kl", np.mean(teacher_losses))
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/clip_range", clip_range)
        if self.clip_range_vf is not None:
            self.logger.record("train/clip_range_vf", clip_range_vf)


__all__ = ["TeacherAction", "TeacherKLMaskablePPO", "TeacherRolloutBuffer", "teacher_nll"]
