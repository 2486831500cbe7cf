"""Double DQN on top of Stable-Baselines3's DQN, with optional action masking at prediction.

SB3's ``DQN`` bootstraps from ``max_a Q_target(s', a)``, which over-estimates values because the
same noisy network both picks and scores the next action. The paper's router uses Double DQN
(van Hasselt et al., 2016): the online network picks the next action and the target network
scores it,

    y = r + gamma * (1 - done) * Q_target(s', argmax_a Q_online(s', a)).

Only the target changes. ``train`` below does what SB3 2.x's ``DQN.train`` does (Huber loss,
gradient-norm clipping, n-step discounts, ``train/loss`` and ``train/n_updates`` logging) with the
target factored into :meth:`DoubleDQN._target_q` so tests can check it in isolation. Everything
else (replay buffer, epsilon schedule, target-network sync, save/load) is SB3's.

Semi-MDP and masks: with ``replay_buffer_class=SemiMDPReplayBuffer`` (the factory's default for
``LLMCluster-v0``) each transition carries its own discount (``info["discount"]``: gamma_s ** dt
for a step of dt simulated seconds) and the next state's action mask, and the target becomes

    y = r + (1 - done) * discount * Q_target(s', argmax_{a valid in s'} Q_online(s', a)).

Exploration asks the env for its mask (``env_method("action_masks")``) and samples, and
maximises, over valid actions only. ``predict(..., action_masks=...)`` does the same for
evaluation (masked actions get ``-inf``), matching ``MaskablePPO.predict``'s signature.

Demonstrations (DQfD, Hester et al. 2018): with ``set_demonstrations(buffer, ...)`` every
gradient step also draws a share of its batch from a fixed buffer of a teacher's transitions
and adds a large-margin loss on them, max_a [Q(s, a) + margin * (a != a_E)] - Q(s, a_E), whose
weight decays linearly to zero, so a warm start from a good heuristic is kept while the TD loss
takes over. :meth:`pretrain` runs such steps on the demonstrations alone (the behaviour-cloning
warm start, ``llm_lb_gym.agents.imitation``).

Speed (``python -m llm_lb_gym.experiments.bench learner``): an update joins the replay and demonstration
samples into one batch (:meth:`DoubleDQN._update_loss`: three forward passes where the separate
losses took seven, equal to them in value and gradient, tested); acting on one observation goes
from the numpy array to the network without SB3's ``obs_to_tensor``, under
``torch.inference_mode``; the policy's train/eval mode is only switched where it changes what
the network computes; the default Adam is torch's fused kernel. Measured and not taken: joining
current and next states into one pass with gradient (slower: its backward pass runs over twice
the rows); a TorchScript trace for acting (0.29 -> 0.15 ms a batch-1 pass, but
``torch.jit.trace`` is deprecated in torch 2.13); ``torch.compile`` (107 s to compile, and the
compiled update was slower).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import DQN
from torch.nn import functional as F

from llm_lb_gym._validate import ConfigError

from llm_lb_gym.agents.replay import join_samples


DEMO_LOSSES = ("ce", "margin")
_MODE_DEPENDENT = (th.nn.modules.dropout._DropoutNd, th.nn.modules.batchnorm._NormBase)
"""Modules whose output depends on ``train()`` / ``eval()``."""


class DoubleDQN(DQN):
    """SB3 ``DQN`` with the Double-DQN target and mask-aware ``predict``.

    Constructor arguments are exactly SB3 ``DQN``'s. For the paper's hyperparameters (64-64 ReLU
    MLP, batch 512, no random exploration after episode 20) build the keywords with
    :func:`llm_lb_gym.agents.paper_defaults.paper_kwargs`.
    """

    demo_buffer: Any = None
    demo_fraction: float = 0.0
    demo_margin: float = 0.0
    demo_weight: float = 0.0
    demo_decay_updates: int = 1
    demo_loss: str = "ce"

    def _setup_model(self) -> None:
        super()._setup_model()
        policy = self.policy
        opts = getattr(policy, "optimizer_kwargs", None) or {}
        if type(policy.optimizer) is th.optim.Adam and "fused" not in opts and "foreach" not in opts:
            # The same Adam update as one kernel per parameter (torch's default on the CPU loops
            # in Python over ~10 ops per parameter): 1.0 -> 0.3 ms an update on the learned
            # router's network. Rounding may differ in the last bit; a model loaded from a file
            # takes the variant saved with it.
            policy.optimizer = th.optim.Adam(policy.parameters(), **{**policy.optimizer.defaults, "fused": True})

    def _excluded_save_params(self) -> list[str]:
        # Demonstrations are training data, rebuilt from the teacher; not part of the model.
        return [*super()._excluded_save_params(), "demo_buffer"]

    def _target_q(
        self,
        next_observations: th.Tensor,
        rewards: th.Tensor,
        dones: th.Tensor,
        discounts: th.Tensor | float | None = None,
        next_masks: th.Tensor | None = None,
    ) -> th.Tensor:
        """Double-DQN TD target, shape ``(batch, 1)``; no gradient flows through it.

        ``discounts`` is gamma (default), gamma**n per sample with SB3's n-step replay, or the
        env's per-transition discount (``SemiMDPReplayBuffer``); ``next_masks`` (batch,
        n_actions) restricts the online argmax to actions valid in s'. ``rewards`` and ``dones``
        have shape ``(batch, 1)`` as SB3's replay samples do.
        """
        if discounts is None:
            discounts = self.gamma
        with th.no_grad():
            # Online network selects (among valid actions), target network evaluates.
            online = self.q_net(next_observations)
            if next_masks is not None:
                online = online.masked_fill(~next_masks, -th.inf)
            next_actions = online.argmax(dim=1, keepdim=True)
            next_q_values = th.gather(self.q_net_target(next_observations), dim=1, index=next_actions)
            return rewards + (1 - dones) * discounts * next_q_values

    def _td_loss(self, data) -> th.Tensor:
        """Huber TD loss of one batch: the straightforward form (three forward passes), kept as
        the reference :meth:`_update_loss` is tested against."""
        return self._td(data)[0]

    def _td(self, data, q: th.Tensor | None = None) -> tuple[th.Tensor, th.Tensor]:
        """(Huber TD loss, online Q of ``data.observations``); ``q`` if already computed."""
        # For n-step or semi-MDP replay the per-sample discount comes with the sample.
        discounts = getattr(data, "discounts", None)
        discounts = discounts if discounts is not None else self.gamma
        target = self._target_q(data.next_observations, data.rewards, data.dones, discounts,
                                getattr(data, "next_masks", None))
        q = self.q_net(data.observations) if q is None else q
        current = th.gather(q, dim=1, index=data.actions.long())
        return F.smooth_l1_loss(current, target), q

    def _margin_loss(self, data) -> th.Tensor:
        """The imitation term on demonstrations. ``margin`` (DQfD's large margin): the teacher's
        action must beat every other action by ``demo_margin`` (in the learner's reward units).
        ``ce``: cross-entropy of the teacher's action under softmax(Q / demo_margin), a smooth
        version that pulls every action's value, not only the violators' (measured: 87% teacher
        agreement where the hinge reached 80%, near capacity, same steps)."""
        return self._margin_of(self.q_net(data.observations), data.actions.long())

    def _margin_of(self, q: th.Tensor, a: th.Tensor) -> th.Tensor:
        """:meth:`_margin_loss` from the online Q values ``q`` of the demonstrations' states."""
        if self.demo_loss == "ce":
            return F.cross_entropy(q / self.demo_margin, a.reshape(-1))
        bonus = th.full_like(q, self.demo_margin).scatter(1, a, 0.0)
        return ((q + bonus).max(dim=1, keepdim=True).values - th.gather(q, 1, a)).mean()

    def _update_loss(self, replay, demo=None, weight: float = 0.0) -> tuple[th.Tensor, th.Tensor | None]:
        """(loss, margin loss or None) of one update on ``replay`` plus ``demo`` samples.

        The same value as ``(1 - share) * td(replay) + share * td(demo) + weight * margin(demo)``
        with ``share`` the demonstrations' part of the batch (the mean of the Huber loss over the
        joined batch weighs both parts so), computed with three forward passes instead of
        seven: the online network once over the joined states (its demo rows also give the
        margin loss), the online and the target network once each over the joined next states.
        Small per-call costs dominate at these sizes (about 40 small ops a pass), so fewer, larger
        passes are what makes an update cheap.
        """
        batch = replay if demo is None else join_samples(replay, demo, self.gamma)
        loss, q = self._td(batch)
        margin = None
        if demo is not None and weight > 0:
            n = replay.observations.shape[0]
            margin = self._margin_of(q[n:], demo.actions.long())
            loss = loss + weight * margin
        return loss, margin

    def set_demonstrations(self, buffer, fraction: float = 0.25, margin: float = 0.8,
                           weight: float = 1.0, decay_updates: int = 10_000, loss: str = "ce") -> None:
        """Mix a teacher's transitions into every update (see the module docstring). The margin
        loss weight falls linearly from ``weight`` to 0 over ``decay_updates`` gradient steps
        counted from now; the demonstrations' TD share stays."""
        from llm_lb_gym._validate import check_int, check_range

        check_range("imitation.demo_fraction", fraction, 0.0, 1.0, hi_open=True)
        check_range("imitation.margin", margin, 0.0)
        check_range("imitation.margin_weight", weight, 0.0)
        check_int("imitation.margin_decay_updates", decay_updates, 1)
        from llm_lb_gym._validate import check_choice

        check_choice("imitation.loss", loss, DEMO_LOSSES)
        if loss == "ce" and margin <= 0:
            raise ConfigError(f"imitation.margin={margin} must be > 0 with loss=ce (it is the softmax temperature)")
        self.demo_loss = loss
        if buffer is None or buffer.size() == 0:
            raise ConfigError("set_demonstrations needs a non-empty buffer of transitions")
        self.demo_buffer = buffer
        self.demo_fraction = float(fraction)
        self.demo_margin = float(margin)
        self.demo_weight = float(weight)
        self.demo_decay_updates = int(decay_updates)
        self._demo_start = self._n_updates

    def _demo_weight_now(self) -> float:
        done = self._n_updates - getattr(self, "_demo_start", 0)
        return self.demo_weight * max(0.0, 1.0 - done / self.demo_decay_updates)

    def _gradient_step(self, loss: th.Tensor) -> None:
        self.policy.optimizer.zero_grad()
        loss.backward()
        th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        self.policy.optimizer.step()

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        """SB3 ``DQN.train`` with the target of :meth:`_target_q`, plus demonstrations if set."""
        self._policy_mode(True)
        self._update_learning_rate(self.policy.optimizer)

        losses, margins = [], []
        n_demo = int(round(batch_size * self.demo_fraction)) if self.demo_buffer is not None else 0
        for _ in range(gradient_steps):
            replay_data = self.replay_buffer.sample(batch_size - n_demo, env=self._vec_normalize_env)  # type: ignore[union-attr]
            demo = self.demo_buffer.sample(n_demo) if n_demo else None
            loss, margin = self._update_loss(replay_data, demo, self._demo_weight_now() if n_demo else 0.0)
            if margin is not None:
                margins.append(margin.item())
            losses.append(loss.item())
            self._gradient_step(loss)
            self._n_updates += 1

        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))
        if margins:
            self.logger.record("train/demo_margin_loss", np.mean(margins))
            self.logger.record("train/demo_margin_weight", self._demo_weight_now())

    def pretrain(self, gradient_steps: int, batch_size: int | None = None,
                 target_update_interval: int = 500) -> dict[str, float]:
        """Steps on the demonstrations alone (TD + margin, full margin weight): the warm start.
        The target network is synced every ``target_update_interval`` steps. Returns the last
        losses and the teacher-action agreement of the greedy policy on a demo batch."""
        if self.demo_buffer is None:
            raise ConfigError("pretrain needs set_demonstrations(...) first")
        batch_size = batch_size or self.batch_size
        self._policy_mode(True)
        td = margin = 0.0
        for step in range(gradient_steps):
            demo = self.demo_buffer.sample(batch_size)
            td_l, q = self._td(demo)
            m_l = self._margin_of(q, demo.actions.long())
            self._gradient_step(td_l + self.demo_weight * m_l)
            td, margin = td_l.item(), m_l.item()
            if (step + 1) % target_update_interval == 0:
                self.q_net_target.load_state_dict(self.q_net.state_dict())
        self.q_net_target.load_state_dict(self.q_net.state_dict())
        self._policy_mode(False)
        with th.no_grad():
            demo = self.demo_buffer.sample(min(4096, self.demo_buffer.size()))
            agree = (self.q_net(demo.observations).argmax(1) == demo.actions.long().reshape(-1)).float().mean()
        return {"td_loss": td, "margin_loss": margin, "teacher_agreement": float(agree)}

    def _current_masks(self) -> np.ndarray | None:
        env = self.env
        if env is None or not hasattr(env, "env_method"):
            return None
        try:
            return np.stack(env.env_method("action_masks"))
        except AttributeError:
            return None

    def _sample_action(self, learning_starts: int, action_noise=None, n_envs: int = 1):
        """SB3's exploration, restricted to the env's valid actions when it has masks."""
        masks = self._current_masks()
        if masks is None:
            return super()._sample_action(learning_starts, action_noise, n_envs)
        if self.num_timesteps < learning_starts:
            action = np.array([np.random.choice(np.flatnonzero(row)) for row in masks])
        else:
            action, _ = self.predict(self._last_obs, deterministic=False, action_masks=masks)
        action = np.asarray(action).reshape(n_envs)
        return action, action

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

        obs_tensor, vectorized = self._obs_tensor(observation)
        n_batch = next(iter(obs_tensor.values())).shape[0] if isinstance(obs_tensor, dict) else obs_tensor.shape[0]
        masks = self._check_masks(action_masks, n_batch)

        if not deterministic and np.random.rand() < self.exploration_rate:
            # Same global RNG as SB3's exploration, so seeding with ``seed=`` covers both.
            actions = np.array([np.random.choice(np.flatnonzero(row)) for row in masks])
        else:
            self._policy_mode(False)
            with th.inference_mode():
                q_values = self.q_net(obs_tensor).cpu().numpy()
            actions = np.where(masks, q_values, -np.inf).argmax(axis=1)

        if not vectorized:
            actions = actions.squeeze(axis=0)
        return actions, state

    def _obs_tensor(self, observation) -> tuple[th.Tensor | dict, bool]:
        """SB3's ``policy.obs_to_tensor``, with a direct path for a flat ``Box`` observation.

        Acting is batch-1 work done once per env step: SB3's checks and copies cost as much as the
        forward pass. A flat float ``Box`` needs no preprocessing (SB3's ``preprocess_obs`` only
        casts it to float32), so the array becomes a tensor as it is; any other space, or a
        shape that does not fit, goes through SB3 (whose errors name the expected shape).
        """
        space = self.observation_space
        if isinstance(space, spaces.Box) and len(space.shape) == 1 and isinstance(observation, np.ndarray):
            obs = observation if observation.dtype == np.float32 else observation.astype(np.float32)
            if obs.shape[-1:] == space.shape and obs.ndim in (1, 2):
                if not obs.flags.writeable:
                    obs = obs.copy()
                tensor = th.from_numpy(obs).to(self.device)
                return (tensor if obs.ndim == 2 else tensor[None]), obs.ndim == 2
        return self.policy.obs_to_tensor(observation)

    def _mode_matters(self) -> bool:
        """Whether the policy has modules whose output depends on train/eval mode (checked once
        per policy object: a loaded model has a new one)."""
        policy = self.policy
        matters = getattr(policy, "_mode_matters", None)
        if matters is None:
            matters = policy._mode_matters = any(isinstance(m, _MODE_DEPENDENT) for m in policy.modules())
        return matters

    def _policy_mode(self, training: bool) -> None:
        """``policy.set_training_mode(training)``, only where the mode changes what the policy
        computes (dropout, batch norm) and only when it changes.

        SB3 sets the mode at every ``train`` and ``predict`` call and each call walks every
        submodule: 0.3 ms, 7% of the learned router's training time (pyinstrument), for
        networks (SB3's MLPs, :class:`llm_lb_gym.agents.equivariant.InstanceSetQ`) on which it changes
        nothing."""
        if self._mode_matters() and self.policy.training != training:
            self.policy.set_training_mode(training)

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
