"""What sets each agent apart, as data: one :class:`AgentSpec` per name in :data:`AGENTS`.

The factory (``make_agent``, ``load_agent``) and the experiments (``llm_lb_gym.experiments.train``,
``llm_lb_gym.experiments.reproduce``) read the spec instead of comparing names: whether the agent trains on
an SB3 VecEnv or on one gymnasium env, whether it needs an env with ``action_masks()``, its
model file's suffix, which keywords it accepts and which defaults fill the rest. Adding an agent
means its own file and one entry here.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from llm_lb_gym._validate import lookup

from llm_lb_gym.agents.paper_defaults import PAPER_FIELDS, with_paper_defaults

PLAIN_POLICY_KWARGS = frozenset({"net_arch", "activation", "embed_dim"})
"""Top-level keywords the factory folds into an SB3 agent's ``policy_kwargs`` (``embed_dim``:
the equivariant policy's embedding width)."""


def constructor_params(cls: type) -> frozenset[str]:
    """The named keywords of ``cls.__init__`` other than ``env`` (and private or variadic ones)."""
    return frozenset(
        n for n, p in inspect.signature(cls.__init__).parameters.items()
        if n not in ("self", "env") and not n.startswith("_") and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    )


def _sb3_kwargs(cls: type) -> frozenset[str]:
    return constructor_params(cls) | PLAIN_POLICY_KWARGS


def _paper_dqn_kwargs(cls: type) -> frozenset[str]:
    return constructor_params(cls) | PLAIN_POLICY_KWARGS | PAPER_FIELDS


def _reinforce_kwargs(cls: type) -> frozenset[str]:
    # The config's fields rather than the constructor's: config, observation_space and
    # action_space are for load(), not for a config file.
    from llm_lb_gym.agents.reinforce import CONFIG_FIELDS

    return CONFIG_FIELDS | {"seed", "tensorboard_log", "verbose"}


def _double_dqn() -> type:
    from llm_lb_gym.agents.double_dqn import DoubleDQN

    return DoubleDQN


def _dqn() -> type:
    from stable_baselines3 import DQN

    return DQN


def _maskable_ppo() -> type:
    # Imported on use: sb3_contrib pulls in several algorithms the DQN user does not need.
    from llm_lb_gym.agents.maskable_ppo import SemiMDPMaskablePPO

    return SemiMDPMaskablePPO


def _maskable_ppo_kl() -> type:
    from llm_lb_gym.agents.teacher_kl_ppo import TeacherKLMaskablePPO

    return TeacherKLMaskablePPO


def _ppo_kl_kwargs(cls: type) -> frozenset[str]:
    # The subclass takes MaskablePPO's keywords through **kwargs.
    return constructor_params(cls) | constructor_params(cls.__mro__[1]) | PLAIN_POLICY_KWARGS


def _reinforce() -> type:
    from llm_lb_gym.agents.reinforce import REINFORCEAgent

    return REINFORCEAgent


@dataclass(frozen=True)
class AgentSpec:
    """How the factory and the experiments build, train, save and load one kind of agent."""

    name: str
    """The registry key, as in ``conf/agent/<name>.yaml``'s ``name``."""
    load_class: Callable[[], type]
    """Returns the agent class; imported on call, so unused heavy dependencies stay unloaded."""
    vectorized: bool
    """Trains on an SB3 VecEnv (``train.n_envs`` copies; ``VecNormalize`` applies) rather than
    on one gymnasium env."""
    single_env_only: bool
    """Training needs ``train.n_envs == 1``."""
    supports_masks: bool
    """``predict`` takes ``action_masks`` (``llm_lb_gym.rollout.accepts_action_masks`` is true)."""
    requires_mask_env: bool
    """Needs an env with an ``action_masks()`` method to be built (MaskablePPO)."""
    file_suffix: str
    """Suffix of the file ``agent.save(path)`` writes (SB3 appends ``.zip`` itself)."""
    sb3_policy: bool
    """An SB3 algorithm: ``policy`` defaults to ``"MlpPolicy"``, ``net_arch``/``activation`` go
    into ``policy_kwargs``, and ``device`` defaults to the CPU when building and loading (these
    MLPs are too small to gain from a GPU)."""
    allowed_kwargs: Callable[[type], frozenset[str]]
    """The keywords ``make_agent`` accepts, given the class; a typo fails with this list."""
    semi_mdp_replay: bool = False
    """An off-policy SB3 agent whose replay stores each transition's discount and next mask
    (``llm_lb_gym.agents.replay.SemiMDPReplayBuffer``): the discount then comes from the env
    (``reward.discount``, ``reward.horizon_s``), so ``gamma`` is not an agent option."""
    env_discount: bool = False
    """Discounts each transition by the env's ``info["discount"]`` (gamma_s ** dt in simulated
    time on ``LLMCluster-v0``): the discount is then the env's (``reward.discount``,
    ``reward.horizon_s``, ``reward.gamma``) and ``gamma`` is refused as an agent option there."""
    teacher_actions: bool = False
    """Trains on envs wrapped in ``llm_lb_gym.agents.teacher_kl_ppo.TeacherAction`` (the teacher router of
    ``train.imitation.teacher``, with the setting's options), whose action it is penalised
    for leaving (``maskable_ppo_kl``)."""
    defaults: Callable[[dict[str, Any], int | None, int | None], dict[str, Any]] | None = None
    """``(kwargs, total_timesteps, episode_steps) -> kwargs`` with the defaults filled in (the
    paper's settings for the DQN variants, so the two differ only in the target); None: the
    class's own defaults."""


AGENTS: dict[str, AgentSpec] = {
    spec.name: spec
    for spec in (
        AgentSpec("double_dqn", _double_dqn, vectorized=True, single_env_only=False,
                  supports_masks=True, requires_mask_env=False, file_suffix=".zip",
                  sb3_policy=True, allowed_kwargs=_paper_dqn_kwargs, semi_mdp_replay=True,
                  env_discount=True, defaults=with_paper_defaults),
        AgentSpec("dqn", _dqn, vectorized=True, single_env_only=False,
                  supports_masks=False, requires_mask_env=False, file_suffix=".zip",
                  sb3_policy=True, allowed_kwargs=_paper_dqn_kwargs, semi_mdp_replay=True,
                  env_discount=True, defaults=with_paper_defaults),
        AgentSpec("maskable_ppo", _maskable_ppo, vectorized=True, single_env_only=False,
                  supports_masks=True, requires_mask_env=True, file_suffix=".zip",
                  sb3_policy=True, allowed_kwargs=_sb3_kwargs, env_discount=True),
        AgentSpec("maskable_ppo_kl", _maskable_ppo_kl, vectorized=True, single_env_only=False,
                  supports_masks=True, requires_mask_env=True, file_suffix=".zip",
                  sb3_policy=True, allowed_kwargs=_ppo_kl_kwargs, env_discount=True,
                  teacher_actions=True),
        AgentSpec("reinforce", _reinforce, vectorized=False, single_env_only=True,
                  supports_masks=True, requires_mask_env=False, file_suffix=".pt",
                  sb3_policy=False, allowed_kwargs=_reinforce_kwargs, env_discount=True),
    )
}
AGENT_NAMES = tuple(AGENTS)


def agent_spec(name: str) -> AgentSpec:
    """The spec of agent ``name``; the error lists the valid names."""
    return lookup("agent", AGENTS, name)
