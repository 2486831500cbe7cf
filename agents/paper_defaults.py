"""The paper's Double-DQN hyperparameters (Jain et al., App. A.9), as overridable defaults.

What the paper states: an MLP with layers (27, 64), (64, 64), (64, 5) and ReLU, i.e. two hidden
layers of 64 for the 4-instance setting; batch size 512; "no random exploration after episode
20". Learning rate, discount, buffer size and target-update interval are not given, so SB3's
defaults stand unless overridden.

SB3 schedules epsilon by the fraction of ``total_timesteps`` elapsed, not by episodes, so "ends at
episode 20" becomes ``exploration_fraction = 20 * episode_steps / total_timesteps`` (capped at 1:
with fewer than 20 episodes of budget, epsilon reaches its final value only at the end). With
parallel envs SB3 counts every env's steps, so ``episode_steps`` is the length of one env's
episode and "episode 20" means the 20th episode across all envs together.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from llm_lb_gym._validate import check_int, check_range

from llm_lb_gym.agents.nets import activation_class, hidden_sizes


@dataclass(frozen=True)
class PaperDQNDefaults:
    """Double-DQN settings from the paper; every field can be overridden."""

    net_arch: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the Q-network (paper: 64, 64)."""
    activation: str = "relu"
    """Activation between hidden layers, by name (see ``llm_lb_gym.agents.nets.ACTIVATIONS``)."""
    batch_size: int = 512
    """Replay minibatch size (paper: 512)."""
    exploration_end_episode: int = 20
    """Training episode by which epsilon has decayed to ``exploration_final_eps`` (paper: 20)."""
    exploration_initial_eps: float = 1.0
    """Epsilon at the start of training."""
    exploration_final_eps: float = 0.0
    """Epsilon after ``exploration_end_episode``; 0 because the paper stops random exploration."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "net_arch", tuple(hidden_sizes("net_arch", self.net_arch)))
        activation_class(self.activation)
        check_int("batch_size", self.batch_size, lo=1)
        check_int("exploration_end_episode", self.exploration_end_episode, lo=1)
        check_range("exploration_initial_eps", self.exploration_initial_eps, 0.0, 1.0)
        check_range("exploration_final_eps", self.exploration_final_eps, 0.0, 1.0)

    def exploration_fraction(self, total_timesteps: int, episode_steps: int) -> float:
        """Fraction of training over which epsilon decays so that it ends at the set episode."""
        check_int("total_timesteps", total_timesteps, lo=1)
        check_int("episode_steps", episode_steps, lo=1)
        return min(1.0, self.exploration_end_episode * episode_steps / total_timesteps)

    def sb3_kwargs(self, total_timesteps: int | None = None, episode_steps: int | None = None) -> dict[str, Any]:
        """Keyword arguments for SB3 ``DQN``/``DoubleDQN``.

        ``exploration_fraction`` is included only when both ``total_timesteps`` and
        ``episode_steps`` are known; otherwise SB3's default (0.1) applies.
        """
        kwargs: dict[str, Any] = dict(
            policy_kwargs=dict(net_arch=list(self.net_arch), activation_fn=activation_class(self.activation)),
            batch_size=self.batch_size,
            exploration_initial_eps=self.exploration_initial_eps,
            exploration_final_eps=self.exploration_final_eps,
        )
        if total_timesteps is not None and episode_steps is not None:
            kwargs["exploration_fraction"] = self.exploration_fraction(total_timesteps, episode_steps)
        return kwargs


PAPER_FIELDS = frozenset(f.name for f in fields(PaperDQNDefaults))


def paper_kwargs(
    total_timesteps: int | None = None, episode_steps: int | None = None, **overrides: Any
) -> dict[str, Any]:
    """SB3 DQN keywords with the paper's defaults, then ``overrides``.

    Overrides named like a :class:`PaperDQNDefaults` field (``net_arch``, ``activation``,
    ``exploration_end_episode``, ...) change that default; any other key is an SB3 ``DQN``
    keyword and replaces the generated one (``policy_kwargs`` is merged key by key).
    """
    defaults = PaperDQNDefaults(**{k: v for k, v in overrides.items() if k in PAPER_FIELDS})
    kwargs = defaults.sb3_kwargs(total_timesteps, episode_steps)
    for key, value in overrides.items():
        if key in PAPER_FIELDS:
            continue
        if key == "policy_kwargs" and value is not None:
            merged = {**kwargs["policy_kwargs"], **dict(value)}
            merged["activation_fn"] = activation_class(merged["activation_fn"])
            kwargs["policy_kwargs"] = merged
        else:
            kwargs[key] = value
    return kwargs


def with_paper_defaults(
    kwargs: dict[str, Any], total_timesteps: int | None = None, episode_steps: int | None = None
) -> dict[str, Any]:
    """``make_agent``'s keywords for ``DQN``/``DoubleDQN`` with the paper's defaults filled in.

    ``kwargs`` come with ``net_arch`` and ``activation`` already folded into ``policy_kwargs``;
    paper fields in ``kwargs`` (and ``policy_kwargs["net_arch"]``) override the paper's values,
    other keys override the generated ones, and ``policy_kwargs`` is merged key by key.
    """
    kwargs = dict(kwargs)
    policy_kwargs = dict(kwargs.pop("policy_kwargs", None) or {})
    overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in PAPER_FIELDS}
    if "net_arch" in policy_kwargs:
        overrides["net_arch"] = policy_kwargs.pop("net_arch")
    kwargs = {**paper_kwargs(total_timesteps, episode_steps, **overrides), **kwargs}
    kwargs["policy_kwargs"] = {**kwargs.pop("policy_kwargs"), **policy_kwargs}
    return kwargs
