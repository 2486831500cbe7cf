"""A trained policy of an ``llm_lb_gym.experiments.train`` run directory as a served router: shared by
``python -m llm_lb_gym.experiments.serve router --policy RUN_DIR`` and the serving benchmark."""

from __future__ import annotations

from llm_lb_gym.experiments._hydra import env_kwargs


def load_policy(run_dir: str, model_file: str, cfg):
    """The trained policy of an ``llm_lb_gym.experiments.train`` run directory as a router (CPU); a
    missing or unreadable file is a ConfigError naming it."""
    from pathlib import Path

    from llm_lb_gym._validate import ConfigError
    from llm_lb_gym.envs.cluster_env import LLMClusterEnv
    from llm_lb_gym.routers.registry import make_router
    from llm_lb_gym.serve.learned import LearnedPolicyRouter

    d = Path(run_dir)
    cfg_path, model_path = d / "resolved_config.yaml", d / model_file
    for p in (cfg_path, model_path):
        if not p.is_file():
            raise ConfigError(f"--policy: {p} does not exist (give an llm_lb_gym.experiments.train run directory "
                              f"holding resolved_config.yaml and {model_file})")
    if (d / "vecnormalize.pkl").exists():
        raise ConfigError(f"--policy: {d} was trained with VecNormalize, which the service does not apply")
    try:
        from omegaconf import OmegaConf

        train_cfg = OmegaConf.load(cfg_path)
        kind = train_cfg.agent.name
        kw = env_kwargs(train_cfg)
        kw.pop("max_episode_steps", None)    # gym.make's TimeLimit, not the env's
        env = LLMClusterEnv(**kw)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"--policy: {cfg_path} is not a readable train config: {exc}") from None
    if env.m != len(cfg.backends):
        raise ConfigError(f"--policy: the policy was trained for {env.m} instances; "
                          f"{len(cfg.backends)} --backend given")
    try:
        import torch

        from llm_lb_gym.agents.factory import load_agent

        torch.set_num_threads(1)
        agent = load_agent(kind, str(model_path))
    except Exception as exc:
        raise ConfigError(f"--policy: {model_path} could not be loaded as a {kind} model: "
                          f"{type(exc).__name__}: {exc}") from None
    return LearnedPolicyRouter(agent, env, make_router(cfg.router, **cfg.router_options))
