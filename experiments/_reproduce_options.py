"""What a ``llm_lb_gym.experiments.reproduce`` run composes, and the check of all its options
before the first training.

A reproduce run trains several agents per setting for hours, then evaluates, then transfers.
Its loop used to check an option when it reached it: an unknown setting failed after the first
setting's evaluation, an unknown variant after a training, a bad ``transfer`` entry after the
whole evaluation, and ``settings=[]`` exited 0 with an empty report. :func:`check_reproduce_options`
composes every (setting, variant) configuration the run will compose, runs the checks each
command runs on its own options (train's, improve's, evaluate's), builds each env once, and
checks the transfer entries against the settings and variants, so a mistake costs seconds.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
from omegaconf import open_dict

import llm_lb_gym  # noqa: F401
from llm_lb_gym._validate import ConfigError, check_bool, check_choice, check_int, reject_unknown
from llm_lb_gym.experiments._entry_options import MAX_EPISODES, MAX_SEED, _names, check_evaluate_options
from llm_lb_gym.experiments._hydra import CONF_DIR, compose, env_kwargs, to_container
from llm_lb_gym.experiments._training import _check_train_cfg, policy_iteration_config

TRAINERS = ("train", "improve")
"""How a variant is trained: ``train`` (an SB3 agent, ``experiments._training.train``) or
``improve`` (policy iteration, ``experiments._training.train_distilled``)."""
STEPS_PER_REQUEST_LIMIT = 20
"""Evaluation episodes stop after this many env steps per request (round robin needs ~1.2)."""

VARIANT_KEYS = ("reward", "label", "experiment", "trainer", "agent", "overrides")
"""Keys of one ``variants`` entry (``conf/reproduce.yaml``)."""
TRANSFER_KEYS = ("setting", "variant", "num_instances", "policies", "episodes")
"""Keys of one ``transfer`` entry."""


def _experiment(cfg, setting: str, *more: str) -> str:
    """``experiment=`` override: the setting, a variant's own experiments (e.g. learned_router),
    then ``extra_experiments`` (e.g. debug) on top."""
    names = [setting, *more, *list(cfg.get("extra_experiments") or [])]
    return f"experiment={names[0]}" if len(names) == 1 else f"experiment=[{','.join(names)}]"


def _with_workload(cfg, sub):
    """``sub`` (a composed train or evaluate config) with the workload the command selected
    (``workload=trace workload.path=... workload.format=...``) in place of the setting's own."""
    if cfg.get("workload") is not None:
        from omegaconf import OmegaConf

        with open_dict(sub):
            sub.workload = OmegaConf.create(to_container(cfg.workload))
    return sub


def _variant_experiments(var) -> list[str]:
    exp = var.get("experiment")
    return [] if exp is None else ([exp] if isinstance(exp, str) else list(exp))


def improve_overrides(cfg, setting: str, key: str) -> tuple[list[str], str | None]:
    """The ``conf/improve.yaml`` overrides of variant ``key`` (``trainer: improve``) on
    ``setting``, and a note when the setting lacks what the variant asks for. Its
    ``scored_teacher`` experiment reads the setting's searched ``scored_binding`` options; a
    setting without them gets ``late_binding`` as the teacher instead, and the run says so."""
    var = cfg.variants[key]
    more = _variant_experiments(var)
    note = None
    probe = compose("evaluate", [_experiment(cfg, setting)])
    if "scored_teacher" in more and "scored_binding" not in (probe.get("eval") or {}).get("policy_options", {}):
        more = [m for m in more if m != "scored_teacher"]
        note = (f"{setting}: no searched scored_binding options (eval.policy_options.scored_binding); "
                f"variant {key} distils late_binding instead")
    return [_experiment(cfg, setting, *more), f"seed={cfg.seed}",
            f"progress={str(bool(cfg.get('progress', True))).lower()}", *list(var.get("overrides") or [])], note


def train_overrides(cfg, setting: str, key: str) -> list[str]:
    """The ``conf/train.yaml`` overrides of variant ``key`` (``trainer: train``) on ``setting``."""
    var = cfg.variants[key]
    agent = var.get("agent") or cfg.agent   # a variant may name its own agent (ppo_kl)
    overrides = [_experiment(cfg, setting, *_variant_experiments(var)), f"agent={agent}",
                 f"seed={cfg.seed}", f"name={key}", "eval.policies=[round_robin]", "eval.episodes=2",
                 "eval.plot=false", f"progress={str(bool(cfg.get('progress', True))).lower()}",
                 *cfg.train_overrides, *list(var.get("overrides") or [])]
    if var.get("reward"):
        overrides.insert(1, f"reward={var.reward}")
    if cfg.train_episodes is not None:
        overrides.append(f"train.episodes={int(cfg.train_episodes)}")
    return overrides


def eval_config(cfg, setting: str, trained: dict):
    """The evaluation config of ``setting``: the heuristics and the ``trained`` variants
    (``{key: {kind, model, env}}``) on the evaluation seeds."""
    ecfg = _with_workload(cfg, compose("evaluate", [_experiment(cfg, setting), f"seed={cfg.eval_seed}"]))
    with open_dict(ecfg):
        # An experiment states its evaluation under eval.* (train's layout); evaluate's keys are flat.
        exp_eval = ecfg.get("eval") or {}
        ecfg.episodes = int(cfg.eval_episodes if cfg.eval_episodes is not None
                            else exp_eval.get("episodes", ecfg.episodes))
        ecfg.policies = list(cfg.policies if cfg.policies is not None
                             else exp_eval.get("policies", ecfg.policies))
        ecfg.policies += [p for p in (cfg.get("extra_policies") or []) if p not in ecfg.policies]
        ecfg.plot = bool(exp_eval.get("plot", True))
        ecfg.agents = {k: {"kind": v.get("kind") or cfg.agent, "path": v["model"], "env": v.get("env") or {}}
                       for k, v in trained.items()}
        # An agent that defers forever is cut off (requests left unfinished are reported).
        ecfg.env.setdefault("max_episode_steps", STEPS_PER_REQUEST_LIMIT * int(ecfg.env.num_requests))
        ecfg.progress = bool(cfg.get("progress", True))
    return ecfg


def _experiments() -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))


def _compose(config_name: str, overrides: list[str], where: str):
    """``compose`` with Hydra's errors (an unknown experiment or group option, a
    bad override) as a ConfigError naming ``where`` the overrides came from."""
    try:
        return compose(config_name, overrides)
    except ConfigError:
        raise
    except Exception as err:   # hydra.errors.*: MissingConfigException, OverrideParseException, ...
        raise ConfigError(f"{where}: conf/{config_name}.yaml with {overrides} does not compose: "
                          f"{err}".strip()) from None


def _optional_int(name: str, value, lo: int, hi: int) -> None:
    if value is not None:
        check_int(name, value, lo, hi)


def check_reproduce_options(cfg) -> None:
    """Raise ConfigError naming the first bad option of a composed ``reproduce`` config."""
    settings = _names("settings", to_container(cfg.get("settings")))
    if not settings:
        raise ConfigError(f"settings=[] lists no setting: nothing to reproduce; allowed: a list of "
                          f"experiments, e.g. settings=[paper_v100], from {', '.join(_experiments())}")
    bad = [s for s in settings if s not in _experiments()]
    if bad:
        raise ConfigError(f"settings: {bad[0]!r} is not an experiment; allowed: {', '.join(_experiments())}")
    variants = to_container(cfg.get("variants")) or {}
    if not isinstance(variants, dict):
        raise ConfigError(f"variants={variants!r} must be a mapping of variant name to its options")
    run_variants = _names("run_variants", to_container(cfg.get("run_variants")))
    for key in run_variants:
        if key not in variants:
            raise ConfigError(f"run_variants: {key!r} is not a variant; allowed: {', '.join(variants)}")
        var = variants[key]
        if not isinstance(var, dict):
            raise ConfigError(f"variants.{key}={var!r} must be a mapping with keys {', '.join(VARIANT_KEYS)}")
        reject_unknown(f"variants.{key}", var, VARIANT_KEYS)
        check_choice(f"variants.{key}.trainer", var.get("trainer", "train"), TRAINERS)
    for key in _names("retrain", to_container(cfg.get("retrain"))):
        check_choice("retrain[]", key, run_variants)
    _optional_int("train_episodes", cfg.get("train_episodes"), 1, MAX_EPISODES)
    _optional_int("eval_episodes", cfg.get("eval_episodes"), 1, MAX_EPISODES)
    check_int("eval_seed", cfg.get("eval_seed"), 0, MAX_SEED)
    check_int("seed", cfg.get("seed"), 0, MAX_SEED)
    for flag in ("progress", "figures"):
        if cfg.get(flag) is not None:
            check_bool(flag, cfg.get(flag))
    _names("extra_experiments", to_container(cfg.get("extra_experiments")))
    _names("train_overrides", to_container(cfg.get("train_overrides")))
    if cfg.get("models_from") is not None and not Path(str(cfg.models_from)).is_dir():
        raise ConfigError(f"models_from={cfg.models_from!r} is not a directory; allowed: a previous "
                          f"reproduce run's directory, or null")

    for setting in settings:
        _compose("evaluate", [_experiment(cfg, setting)], f"settings: {setting!r}")
        trained = {}
        for key in run_variants:
            var = variants[key]
            where = f"settings: {setting!r}, run_variants: {key!r}"
            if var.get("trainer", "train") == "improve":
                overrides, _ = improve_overrides(cfg, setting, key)
                icfg = _with_workload(cfg, _compose("improve", overrides, where))
                policy_iteration_config(icfg)
                kw, kind = env_kwargs(icfg), "distilled"
            else:
                tcfg = _with_workload(cfg, _compose("train", train_overrides(cfg, setting, key), where))
                _check_train_cfg(tcfg)
                kw, kind = env_kwargs(tcfg), var.get("agent") or cfg.agent
            gym.make("LLMCluster-v0", **kw)
            trained[key] = {"kind": kind, "model": f"<{setting}/{key} model>"}
        ecfg = eval_config(cfg, setting, trained)
        check_evaluate_options(ecfg)
        gym.make("LLMCluster-v0", **env_kwargs(ecfg))
    _check_transfer(to_container(cfg.get("transfer")), settings, run_variants)


def _check_transfer(transfer, settings: list[str], run_variants: list[str]) -> None:
    from llm_lb_gym.routers.registry import ROUTERS

    if transfer is None:
        return
    if not isinstance(transfer, list):
        raise ConfigError(f"transfer={transfer!r} must be a list of entries with keys {', '.join(TRANSFER_KEYS)}")
    for i, spec in enumerate(transfer):
        name = f"transfer[{i}]"
        if not isinstance(spec, dict):
            raise ConfigError(f"{name}={spec!r} must be a mapping with keys {', '.join(TRANSFER_KEYS)}")
        reject_unknown(name, spec, TRANSFER_KEYS)
        for key in ("setting", "variant", "num_instances", "policies"):
            if spec.get(key) is None:
                raise ConfigError(f"{name}.{key} is missing; required: setting, variant, num_instances, policies")
        check_choice(f"{name}.setting", spec["setting"], settings)
        check_choice(f"{name}.variant", spec["variant"], run_variants)
        check_int(f"{name}.num_instances", spec["num_instances"], 1)
        policies = _names(f"{name}.policies", spec["policies"])
        if "round_robin" not in policies:
            raise ConfigError(f"{name}.policies={policies} lacks round_robin, the table's baseline; add it")
        for p in policies:
            check_choice(f"{name}.policies[]", p, ROUTERS)
        _optional_int(f"{name}.episodes", spec.get("episodes"), 1, MAX_EPISODES)
