"""What the router service can route with, from what the package's commands write: shared by
``llm-lb-gym serve router`` and the serving benchmarks.

- a trained network (:func:`load_policy`): the run directory of ``llm-lb-gym improve``
  (``best_policy.pt``, the distilled router) or of ``llm-lb-gym train`` (``best_model.zip``, an
  SB3 agent), with the ``resolved_config.yaml`` beside it: the env of that config gives the
  observation, candidates, order and mask the network was trained with;
- a heuristic router's options (:func:`router_options_from`): an experiment's tuned options
  (``conf/evaluate.yaml`` composed with ``experiment=NAME``, ``eval.policy_options[ROUTER]``),
  an options file (YAML ``{ROUTER: {...}}``, e.g. ``llm-lb-gym policy_search``'s
  ``scored_binding.yaml``, or a run's ``resolved_config.yaml``), or a policy-search run
  directory holding ``ROUTER.yaml``.

What cannot be served is a ConfigError naming the file and why, before the service starts.
"""

from __future__ import annotations

from pathlib import Path

from llm_lb_gym.experiments._hydra import default_router_options, env_kwargs

IMPROVE_MODEL = "best_policy.pt"
TRAIN_MODEL = "best_model.zip"

UNSERVED_FEATURES = {
    "cached_prefix": "it reads each instance's prefix cache, which the service does not see",
    "speed": "it describes a mixed cluster; the service routes identical backends",
    "kv_size": "it describes a mixed cluster; the service routes identical backends",
}
"""Observation features a served network cannot be given, and why (``obs.features``)."""


def _error(msg: str):
    from llm_lb_gym._validate import ConfigError

    return ConfigError(msg)


def find_model(path: str, model_file: str | None) -> tuple[Path, Path]:
    """(run directory, model file) of ``--policy PATH [--policy-model FILE]``: PATH is a run
    directory (the model found by name: ``best_policy.pt``, then ``best_model.zip``) or the
    model file itself."""
    p = Path(path)
    if p.is_file():
        return p.parent, p
    if not p.is_dir():
        raise _error(f"--policy: {p} does not exist (give the run directory of llm-lb-gym improve or "
                     f"llm-lb-gym train, or its {IMPROVE_MODEL} / {TRAIN_MODEL})")
    if model_file:
        m = p / model_file
        if not m.is_file():
            raise _error(f"--policy: {m} does not exist (--policy-model {model_file})")
        return p, m
    for name in (IMPROVE_MODEL, TRAIN_MODEL):
        if (p / name).is_file():
            return p, p / name
    searched = sorted(f.stem for f in p.glob("*.yaml") if f.stem in ("scored_binding", "late_binding"))
    if searched:   # llm-lb-gym robust / policy_search write options, not a network
        raise _error(f"--policy: {p} holds searched options ({', '.join(f + '.yaml' for f in searched)}), "
                     f"not a network: serve them with --router {searched[-1]} --options-from {p}")
    raise _error(f"--policy: {p} holds neither {IMPROVE_MODEL} (llm-lb-gym improve) nor {TRAIN_MODEL} "
                 f"(llm-lb-gym train); give --policy-model FILE for another file")


def read_run(path: str, model_file: str | None = None, where: str = "--policy"):
    """A trained network's run, read once for every loader (serve, benchmark): (run directory,
    model file, the run's config, the agent kind ``distilled`` or the SB3 ``agent.name``, the
    env keywords the network acts with: the run's env, a distilled network's with
    ``DistilledAgent.env_options``). Errors name ``where``."""
    from omegaconf import OmegaConf

    from llm_lb_gym._validate import ConfigError

    try:
        d, model = find_model(path, model_file)
    except ConfigError as err:
        raise _error(str(err).replace("--policy", where, 1)) from None
    cfg_path = d / "resolved_config.yaml"
    if not cfg_path.is_file():
        raise _error(f"{where}: {cfg_path} does not exist (the run's resolved config: the env the "
                     f"network was trained in)")
    try:
        train_cfg = OmegaConf.load(cfg_path)
        kw = env_kwargs(train_cfg)
    except Exception as exc:
        raise _error(f"{where}: {cfg_path} is not a readable run config: {exc}") from None
    kw.pop("max_episode_steps", None)    # gym.make's TimeLimit, not the env's
    if model.suffix == ".pt":
        from llm_lb_gym.agents.policy_iteration import DistilledAgent

        return d, model, train_cfg, "distilled", DistilledAgent.env_options(kw)
    kind = OmegaConf.select(train_cfg, "agent.name")
    if kind is None:
        raise _error(f"{where}: {cfg_path} names no agent (agent.name) for {model.name}; an llm-lb-gym "
                     f"improve run's network is {IMPROVE_MODEL}")
    return d, model, train_cfg, str(kind), kw


def _check_servable(env, cfg_path: Path) -> None:
    for f in env.obs_cfg.features:
        if f in UNSERVED_FEATURES:
            raise _error(f"--policy: the network of {cfg_path} observes {f!r}, which the service cannot "
                         f"give: {UNSERVED_FEATURES[f]}")
    if not env.speeds.homogeneous:
        raise _error(f"--policy: {cfg_path} trained on a mixed cluster (env.instances); the service "
                     f"routes identical backends")


def load_policy(path: str, model_file: str | None, cfg, fallback: str | None = None,
                fallback_options: dict | None = None):
    """The trained network of an ``improve`` or ``train`` run as a router (CPU). ``fallback``:
    the router while a backend is down (the network fixes the instance count); None: the
    network's own (the distilled router's teacher with its options, an SB3 agent's
    ``action.fallback_router``)."""
    from llm_lb_gym.envs.cluster_env import LLMClusterEnv
    from llm_lb_gym.routers.registry import make_router
    from llm_lb_gym.serve.learned import LearnedPolicyRouter

    d, model, _, kind, kw = read_run(path, model_file)
    cfg_path = d / "resolved_config.yaml"
    if (d / "vecnormalize.pkl").exists():
        raise _error(f"--policy: {d} was trained with VecNormalize, which the service does not apply")
    distilled = kind == "distilled"
    try:
        env = LLMClusterEnv(**kw)
    except Exception as exc:
        raise _error(f"--policy: {cfg_path} is not a readable run config: {exc}") from None
    _check_servable(env, cfg_path)
    if env.m != len(cfg.backends):
        raise _error(f"--policy: the network was trained for {env.m} instances; "
                     f"{len(cfg.backends)} --backend given")
    try:
        import torch

        torch.set_num_threads(1)
        if distilled:
            from llm_lb_gym.agents.policy_iteration import DistilledAgent, NetPolicy

            agent = DistilledAgent(NetPolicy.load(model), env)
        else:
            from llm_lb_gym.agents.factory import load_agent

            agent = load_agent(kind, str(model))
    except Exception as exc:
        raise _error(f"--policy: {model} could not be loaded as a {kind} model: "
                     f"{type(exc).__name__}: {exc}") from None
    if fallback is None:
        if distilled:
            fallback, fallback_options = agent.policy.teacher, agent.policy.teacher_options
        else:
            fallback, fallback_options = env.cfg.action.fallback_router, {}
    return LearnedPolicyRouter(agent, env, make_router(fallback, **(fallback_options or {})),
                               source=str(model))


def served_router_options(spec: str | None, router: str) -> dict:
    """What a served router runs with: ``--options-from SPEC``'s options, else the default
    setting's (so ``serve router --router scored_binding`` is the router the benchmark judged)."""
    return router_options_from(spec, router) if spec else default_router_options(router)


def router_options_from(spec: str, router: str) -> dict:
    """The options of ``router`` that ``--options-from SPEC`` names (module docstring)."""
    p = Path(spec)
    if p.is_dir():
        f = p / f"{router}.yaml"
        if not f.is_file():
            raise _error(f"--options-from {spec}: a directory must hold {router}.yaml (what llm-lb-gym "
                         f"policy_search writes for scored_binding); it does not")
        p = f
    if p.is_file():
        import yaml

        try:
            data = yaml.safe_load(p.read_text())
        except Exception as exc:
            raise _error(f"--options-from {p}: not YAML: {exc}") from None
        if isinstance(data, dict) and isinstance(data.get("eval"), dict):   # a resolved config
            data = data["eval"].get("policy_options") or {}
        if not isinstance(data, dict) or not isinstance(data.get(router), (dict, type(None))) \
                or router not in data:
            keys = ", ".join(map(str, data)) if isinstance(data, dict) else type(data).__name__
            raise _error(f"--options-from {p}: expected a mapping {{{router}: {{option: value}}}} "
                         f"(or a run's resolved_config.yaml); found keys: {keys}")
        return dict(data[router] or {})
    if "/" in spec or spec.endswith((".yaml", ".yml")):
        raise _error(f"--options-from {spec}: no such file or directory")
    return experiment_router_options(spec, router)


def experiment_router_options(experiment: str, router: str) -> dict:
    """``eval.policy_options[router]`` of conf/evaluate.yaml composed with ``experiment``."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from importlib.resources import files

    known = sorted(f.name[:-5] for f in (files("llm_lb_gym.conf") / "experiment").iterdir()
                   if f.name.endswith(".yaml"))
    if experiment not in known:
        raise _error(f"--options-from {experiment!r}: not a file, directory or experiment; "
                     f"experiments: {', '.join(known)}")
    with initialize_config_module("llm_lb_gym.conf", version_base=None):
        cfg = compose("evaluate", overrides=[f"experiment={experiment}"])
    opts = OmegaConf.to_container(cfg.eval.policy_options or {}, resolve=True)
    return dict(opts.get(router) or {})
