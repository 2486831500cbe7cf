"""REINFORCE: an agent that does not come from Stable-Baselines3, a template for your own.

An agent only needs the :class:`llm_lb_gym.agents.base.Agent` methods (``learn``, ``predict``, ``save``,
``load``). :class:`REINFORCEAgent` is Monte-Carlo policy gradient in about a hundred lines of
PyTorch, with a masked softmax over the actions (invalid actions get probability 0). It accepts
SB3 callbacks, so ``EpisodeMetricsCallback`` logs its episodes to TensorBoard like any SB3 model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.utils import configure_logger

from llm_lb_gym._validate import ConfigError, check_int, check_range, reject_unknown

from llm_lb_gym.agents.nets import activation_class, hidden_sizes, mlp

_FORMAT = "llm_lb_gym.REINFORCEAgent/1"


@dataclass(frozen=True)
class REINFORCEConfig:
    """Hyperparameters of :class:`REINFORCEAgent`."""

    learning_rate: float = 1e-3
    """Adam step size."""
    gamma: float = 0.99
    """Discount per step of the returns-to-go, for envs that do not report their own: a
    transition whose ``info`` has ``"discount"`` (``LLMCluster-v0``: gamma_s ** dt of the step's
    simulated time, ``reward.discount``) is discounted by that instead."""
    episodes_per_update: int = 4
    """Complete episodes collected per gradient step (REINFORCE needs whole episodes)."""
    normalize_returns: bool = True
    """Standardise the batch's returns: a baseline that cuts the gradient's variance."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus that keeps the policy from collapsing early."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip per update."""
    net_arch: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the policy MLP."""
    activation: str = "relu"
    """Activation by name (see ``llm_lb_gym.agents.nets.ACTIVATIONS``)."""

    def __post_init__(self) -> None:
        check_range("learning_rate", self.learning_rate, 0.0, lo_open=True)
        check_range("gamma", self.gamma, 0.0, 1.0)
        check_int("episodes_per_update", self.episodes_per_update, lo=1)
        check_range("ent_coef", self.ent_coef, 0.0)
        check_range("max_grad_norm", self.max_grad_norm, 0.0, lo_open=True)
        object.__setattr__(self, "net_arch", tuple(hidden_sizes("net_arch", self.net_arch)))
        activation_class(self.activation)


CONFIG_FIELDS = frozenset(f.name for f in fields(REINFORCEConfig))


def returns_to_go(rewards: list[float], discounts: list[float]) -> list[float]:
    """G_t = r_t + d_t * G_{t+1} (G after the last step is 0): ``discounts[t]`` is the factor
    between step t and step t + 1, as the env reports it with transition t."""
    g, out = 0.0, [0.0] * len(rewards)
    for t in range(len(rewards) - 1, -1, -1):
        g = rewards[t] + discounts[t] * g
        out[t] = g
    return out


def _masked_logits(logits: th.Tensor, masks: th.Tensor | None) -> th.Tensor:
    """Invalid actions get -inf logits, hence probability exactly 0 after the softmax."""
    return logits if masks is None else logits.masked_fill(~masks, -th.inf)


class REINFORCEAgent:
    """Monte-Carlo policy gradient with a masked-softmax MLP policy on a single gymnasium env.

    Masks come from ``info["action_mask"]`` when the env provides it, else from its
    ``action_masks()`` method, else every action is valid. Returns are discounted rewards-to-go,
    G_t = r_t + d_t G_{t+1} with d_t the transition's own discount (``info["discount"]``, else
    ``gamma``), standardised per update batch; a partial episode left when ``learn`` stops is
    discarded.

    Args:
        env: a gymnasium env with a flat ``Box`` observation and ``Discrete`` actions; None for a
            predict-only agent (then pass ``observation_space`` and ``action_space``).
        config: hyperparameters; keyword ``overrides`` (``learning_rate=...``) replace fields.
        seed: seeds the network initialisation, the action sampling and the env's first reset.
        tensorboard_log: folder for TensorBoard runs ``REINFORCE_<n>`` (None: no files).
    """

    def __init__(
        self,
        env: gym.Env | None = None,
        config: REINFORCEConfig | None = None,
        *,
        seed: int | None = None,
        tensorboard_log: str | None = None,
        verbose: int = 0,
        observation_space: spaces.Box | None = None,
        action_space: spaces.Discrete | None = None,
        **overrides: Any,
    ) -> None:
        reject_unknown("REINFORCEAgent", overrides, CONFIG_FIELDS)
        self.config = replace(config or REINFORCEConfig(), **overrides)
        self.env = env
        self.observation_space = env.observation_space if env is not None else observation_space
        self.action_space = env.action_space if env is not None else action_space
        if not isinstance(self.observation_space, spaces.Box) or not isinstance(self.action_space, spaces.Discrete):
            raise ConfigError(
                "REINFORCEAgent needs a Box observation space and a Discrete action space; got "
                f"{self.observation_space} and {self.action_space}"
            )
        self.seed = seed
        self.tensorboard_log = tensorboard_log
        self.verbose = verbose
        self.num_timesteps = 0
        self.n_actions = int(self.action_space.n)
        self._obs_dim = int(np.prod(self.observation_space.shape))
        self._rng = th.Generator().manual_seed(seed if seed is not None else int(np.random.SeedSequence().entropy % 2**63))
        with th.random.fork_rng(devices=[]):  # seed the init without touching global torch state
            th.manual_seed(int(th.randint(0, 2**62, (1,), generator=self._rng)))
            self.policy = mlp(self._obs_dim, self.n_actions, self.config.net_arch, self.config.activation)
        self.optimizer = th.optim.Adam(self.policy.parameters(), lr=self.config.learning_rate)
        self._logger: Logger | None = None
        self._env_has_mask_method: bool | None = None

    # -- SB3-compatible plumbing (callbacks read these) ------------------------------------------
    @property
    def logger(self) -> Logger:
        if self._logger is None:
            if self.tensorboard_log is None and not self.verbose:
                self._logger = Logger(folder=None, output_formats=[])
            else:
                self._logger = configure_logger(self.verbose, self.tensorboard_log, "REINFORCE")
        return self._logger

    def set_logger(self, logger: Logger) -> None:
        self._logger = logger

    def get_env(self) -> gym.Env | None:
        return self.env

    def set_env(self, env: gym.Env) -> None:
        if env.observation_space.shape != self.observation_space.shape or env.action_space != self.action_space:
            raise ConfigError(
                f"env spaces {env.observation_space}, {env.action_space} differ from the agent's "
                f"{self.observation_space}, {self.action_space}"
            )
        self.env = env
        self._env_has_mask_method = None

    # -- acting --------------------------------------------------------------------------------
    def _logits(self, obs: np.ndarray) -> th.Tensor:
        return self.policy(th.as_tensor(np.asarray(obs, dtype=np.float32).reshape(-1, self._obs_dim)))

    def predict(
        self,
        observation: np.ndarray,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = True,
        action_masks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, None]:
        """Greedy (``deterministic``) or sampled action(s) for one or a batch of observations."""
        obs = np.asarray(observation, dtype=np.float32)
        vectorized = obs.ndim > len(self.observation_space.shape)
        with th.no_grad():
            logits = self._logits(obs)
            masks = None
            if action_masks is not None:
                masks = th.as_tensor(np.asarray(action_masks, dtype=bool).reshape(logits.shape))
                if not masks.any(dim=1).all():
                    raise ConfigError("action_masks marks no action valid for some observation")
            logits = _masked_logits(logits, masks)
            if deterministic:
                actions = logits.argmax(dim=1)
            else:
                actions = th.multinomial(th.softmax(logits, dim=1), 1, generator=self._rng).squeeze(1)
        actions_np = actions.numpy()
        return (actions_np if vectorized else actions_np[0]), None

    def _mask_from(self, info: Mapping[str, Any]) -> np.ndarray | None:
        if "action_mask" in info:
            return np.asarray(info["action_mask"], dtype=bool)
        if self._env_has_mask_method is None:
            try:
                self.env.get_wrapper_attr("action_masks")
                self._env_has_mask_method = True
            except AttributeError:
                self._env_has_mask_method = False
        return np.asarray(self.env.get_wrapper_attr("action_masks")(), dtype=bool) if self._env_has_mask_method else None

    # -- learning ------------------------------------------------------------------------------
    def learn(
        self,
        total_timesteps: int,
        callback: BaseCallback | list[BaseCallback] | None = None,
        reset_num_timesteps: bool = True,
    ) -> REINFORCEAgent:
        """Run ``total_timesteps`` env steps, updating after every ``episodes_per_update`` episodes."""
        if self.env is None:
            raise ConfigError("REINFORCEAgent.learn needs an env; pass one or call set_env")
        check_int("total_timesteps", total_timesteps, lo=1)
        if reset_num_timesteps:
            self.num_timesteps = 0
        if isinstance(callback, list):
            callback = CallbackList(callback)
        if callback is not None:
            callback.init_callback(self)  # type: ignore[arg-type]
        cb_locals: dict[str, Any] = {}
        if callback is not None:
            callback.on_training_start(cb_locals, globals())

        obs, info = self.env.reset(seed=self.seed if self.num_timesteps == 0 else None)
        episode: list[tuple[np.ndarray, np.ndarray | None, int, float, float]] = []
        finished: list[list[tuple[np.ndarray, np.ndarray | None, int, float, float]]] = []
        for _ in range(int(total_timesteps)):
            mask = self._mask_from(info)
            action, _ = self.predict(obs, deterministic=False, action_masks=mask)
            next_obs, reward, terminated, truncated, info = self.env.step(int(action))
            self.num_timesteps += 1
            discount = float(info.get("discount", self.config.gamma))
            episode.append((np.asarray(obs, dtype=np.float32), mask, int(action), float(reward), discount))
            done = terminated or truncated
            if callback is not None:
                callback.update_locals(
                    {"infos": [info], "dones": np.array([done]), "rewards": np.array([reward])}
                )
                if not callback.on_step():
                    break
            obs = next_obs
            if done:
                finished.append(episode)
                episode = []
                obs, info = self.env.reset()
                if len(finished) == self.config.episodes_per_update:
                    self._update(finished)
                    finished = []
        if callback is not None:
            callback.on_training_end()
        return self

    def _update(self, episodes: list[list[tuple[np.ndarray, np.ndarray | None, int, float, float]]]) -> None:
        """One policy-gradient step on complete episodes: minimise -sum log pi(a|s) * G."""
        cfg = self.config
        obs, masks, actions, returns = [], [], [], []
        for ep in episodes:
            returns.extend(returns_to_go([t[3] for t in ep], [t[4] for t in ep]))
            for o, m, a, _, _ in ep:
                obs.append(o)
                masks.append(np.ones(self.n_actions, dtype=bool) if m is None else m)
                actions.append(a)
        g_t = th.as_tensor(np.asarray(returns, dtype=np.float32))
        if cfg.normalize_returns and len(g_t) > 1:
            g_t = (g_t - g_t.mean()) / (g_t.std() + 1e-8)
        logits = _masked_logits(self._logits(np.stack(obs)), th.as_tensor(np.stack(masks)))
        log_probs = th.log_softmax(logits, dim=1)
        chosen = log_probs.gather(1, th.as_tensor(actions).unsqueeze(1)).squeeze(1)
        # 0 * -inf is nan for masked actions; their probability is 0 so their entropy term is 0.
        entropy = -(log_probs.exp() * log_probs.nan_to_num(neginf=0.0)).sum(dim=1).mean()
        loss = -(chosen * g_t).mean() - cfg.ent_coef * entropy

        self.optimizer.zero_grad()
        loss.backward()
        th.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
        self.optimizer.step()

        self.logger.record("train/loss", loss.item())
        self.logger.record("train/entropy", entropy.item())
        self.logger.record("rollout/ep_rew_mean", float(np.mean([sum(t[3] for t in ep) for ep in episodes])))
        self.logger.record("rollout/ep_len_mean", float(np.mean([len(ep) for ep in episodes])))
        self.logger.dump(step=self.num_timesteps)

    # -- persistence ---------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write config, spaces' sizes and weights with ``torch.save`` (loadable weights-only)."""
        th.save(
            {
                "format": _FORMAT,
                "config": asdict(self.config),
                "obs_shape": tuple(self.observation_space.shape),
                "n_actions": self.n_actions,
                "num_timesteps": self.num_timesteps,
                "policy": self.policy.state_dict(),
            },
            path,
        )

    @classmethod
    def load(cls, path: str | Path, env: gym.Env | None = None, **kwargs: Any) -> REINFORCEAgent:
        """Restore a saved agent; ``env`` (optional) must match the saved spaces to continue training."""
        data = th.load(path, weights_only=True)
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ConfigError(f"{path} is not a saved REINFORCEAgent (format {_FORMAT})")
        obs_space = spaces.Box(-np.inf, np.inf, shape=tuple(data["obs_shape"]), dtype=np.float32)
        agent = cls(
            None,
            REINFORCEConfig(**data["config"]),
            observation_space=obs_space,
            action_space=spaces.Discrete(int(data["n_actions"])),
            **kwargs,
        )
        agent.policy.load_state_dict(data["policy"])
        agent.num_timesteps = int(data["num_timesteps"])
        if env is not None:
            agent.set_env(env)
        return agent
