"""The options of ``llm_lb_gym.experiments.evaluate`` (and of train's final evaluation, which runs it),
checked before anything runs, the way ``gym.make`` checks env options: type, range and allowed
values, each error naming the option.

Unchecked, ``episodes=0`` reached numpy as an empty seed list (``seeds[0]``: IndexError),
``episodes=2.5`` was truncated to 2, ``episodes=-1`` ran nothing, ``policies=[]`` crashed in
the summary, ``policies=jsq`` (a string) iterated its letters, an unknown ``baseline`` printed
"n/a" in every row, and ``seed=1.5`` was truncated: each either crashed deep inside numpy or
silently did something else.
"""

from __future__ import annotations

from llm_lb_gym._validate import (ConfigError, check_bool, check_choice, check_int, lookup,
                                  reject_unknown)

from llm_lb_gym.experiments._hydra import to_container

MAX_EPISODES = 1_000_000
"""Most evaluation episodes per policy (each is a full simulated episode)."""
MAX_SEED = 2**63 - 1
"""Largest seed (episode i uses seed + i, a non-negative 64-bit integer for numpy)."""
AGENT_KEYS = ("kind", "path", "env", "any_instances")
"""Keys of one ``agents`` entry (see ``llm_lb_gym.experiments._evaluation._load_agent``)."""


def _plain(node):
    """A plain value of ``node``: containers resolved (``to_container``), scalars as they are."""
    from omegaconf import OmegaConf

    return to_container(node) if OmegaConf.is_config(node) else node


def _names(name: str, value) -> list:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name}={value!r} must be a list of names, e.g. {name}=[round_robin,jsq]")
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"{name} holds {bad[0]!r}, not a name")
    dup = sorted({v for v in value if value.count(v) > 1})
    if dup:
        raise ConfigError(f"{name} lists {', '.join(dup)} more than once")
    return list(value)


def _mapping(name: str, value) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{name}={value!r} must be a mapping (name: options)")
    return value


def check_router_options(name: str, router: str, options) -> None:
    """``options`` (a mapping, or None) of registered router ``router``: known keys and valid
    values, by building the router once (cheap: no episode), each error prefixed with ``name``."""
    from llm_lb_gym.routers.registry import ROUTER_CLASSES, make_router, router_options

    lookup("router", ROUTER_CLASSES, router)
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise ConfigError(f"{name}={options!r} must be a mapping of router {router!r}'s options")
    reject_unknown(name, options, router_options(router))
    try:
        make_router(router, **options)
    except ConfigError as err:
        raise type(err)(f"{name}: {err}") from None


def check_policy_options(name: str, value) -> None:
    """``{router name: {option: value}}``: known routers, known options and valid values (each
    router built once, so a bad value fails before the first episode, not at its router's turn)."""
    for router, options in _mapping(name, value).items():
        check_router_options(f"{name}.{router}", router, options)


def check_agents(value) -> dict:
    """``{name: {kind, path, env?, any_instances?}}`` with a known kind."""
    agents = _mapping("agents", value)
    if not agents:   # heuristics only: no agent registry (it needs the rl extra's torch)
        return agents
    from llm_lb_gym.agents.registry import AGENTS

    for name, spec in agents.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"agents.{name}={spec!r} must be a mapping with kind and path")
        reject_unknown(f"agents.{name}", spec, AGENT_KEYS)
        for key in ("kind", "path"):
            if spec.get(key) in (None, ""):
                raise ConfigError(f"agents.{name}.{key} is missing; allowed keys: {', '.join(AGENT_KEYS)}")
        lookup("agent kind", {**AGENTS, "distilled": None}, spec["kind"])   # distilled: llm_lb_gym.agents.policy_iteration
        if not isinstance(spec["path"], str):
            raise ConfigError(f"agents.{name}.path={spec['path']!r} must be a file path")
        if spec.get("env") is not None and not isinstance(spec["env"], dict):
            raise ConfigError(f"agents.{name}.env={spec['env']!r} must be a mapping of env options")
        if spec.get("any_instances") is not None:
            check_bool(f"agents.{name}.any_instances", spec["any_instances"])
    return agents


def check_evaluate_options(cfg, prefix: str = "") -> None:
    """Every option ``evaluate(cfg)`` reads besides the env's (those ``gym.make`` checks);
    ``prefix`` names where they come from (train's ``eval.``)."""
    from llm_lb_gym.routers.registry import ROUTER_CLASSES

    to_container = _plain

    episodes, seed = cfg.get("episodes"), cfg.get("seed")
    check_int(f"{prefix}episodes", episodes, 1, MAX_EPISODES)
    check_int(f"{prefix}seed", seed, 0, MAX_SEED - int(episodes) + 1)
    policies = _names(f"{prefix}policies", to_container(cfg.get("policies")))
    for p in policies:
        lookup("router", ROUTER_CLASSES, p)
    agents = check_agents(to_container(cfg.get("agents")))
    clash = sorted(set(policies) & set(agents))
    if clash:
        raise ConfigError(f"agents named like policies: {', '.join(clash)}; rename the agents")
    deciders = policies + list(agents)
    if not deciders:
        raise ConfigError(f"{prefix}policies=[] and no agents: nothing to evaluate; list routers, "
                          f"e.g. {prefix}policies=[round_robin,jsq], or give agents")
    baseline = cfg.get("baseline")
    if not isinstance(baseline, str):
        raise ConfigError(f"{prefix}baseline={baseline!r} must be the name of an evaluated "
                          f"policy; allowed: {', '.join(deciders)}")
    check_choice(f"{prefix}baseline", baseline, deciders)
    check_policy_options(f"{prefix}policy_options", to_container(cfg.get("policy_options")))
    check_policy_options("eval.policy_options",
                         to_container((cfg.get("eval") or {}).get("policy_options")))
    for flag in ("progress", "plot"):
        if cfg.get(flag) is not None:
            check_bool(flag, cfg.get(flag))
