"""Every Hydra config group composes and what it describes can be built.

The groups are composed through ``conf/train.yaml`` (the entry point that uses all of them), one
option at a time, and then instantiated: the env for env/engine/workload/reward/experiment
options (reset once, on a short episode), the predictor for predictor options (skipped when its
trained artifact is absent), the agent for agent options. Launcher presets compose with
Hydra's own config. A typo in a config must fail here, not in a two-hour run.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import llm_lb_gym  # noqa: F401
from llm_lb_gym.experiments._hydra import CONF_DIR, env_kwargs, to_container
from llm_lb_gym._validate import ConfigError

torch.set_num_threads(1)
CONF = Path(CONF_DIR)
ENV_GROUPS = ("env", "engine", "workload", "reward", "experiment")


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(overrides: list[str], config_name: str = "train", hydra_cfg: bool = False):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=hydra_cfg)


def _make_env_or_skip(kw: dict):
    """The env of ``kw``, reset once; skip when the option reads ../shared/data that is absent."""
    try:
        env = gym.make("LLMCluster-v0", **kw)
        obs, _ = env.reset(seed=0)
    except FileNotFoundError as err:
        pytest.skip(f"needs shared data: {err}")
    return env, obs


CASES = [(g, o) for g in ENV_GROUPS for o in _options(g)]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"
TRACE_FIXTURES = {"azure": "tiny_azure.csv", "mooncake": "tiny_mooncake.jsonl",
                  "burstgpt": "tiny_burstgpt.csv", "lengths": "tiny_lengths.csv"}
"""One tiny made-up file per trace format (tests/fixtures/traces), as the README points at."""
REQUIRED = {("workload", "trace"): [f"workload.path={FIXTURES / TRACE_FIXTURES['azure']}",
                                    "workload.format=azure"]}
"""Options whose config leaves values to the user (``???``): what a user would add."""
STACKED = {("experiment", "scored_teacher"): "[v100_near_capacity,learned_router,scored_teacher]"}
"""Experiments that only stack on a setting (they read its router options): composed so."""


@pytest.mark.parametrize("group,option", CASES, ids=[f"{g}={o}" for g, o in CASES])
def test_env_groups_compose_and_make_env(group, option):
    value = STACKED.get((group, option), option)
    cfg = _compose([f"{group}={value}", *REQUIRED.get((group, option), [])])
    kw = env_kwargs(cfg)
    kw["num_requests"] = 40
    env, obs = _make_env_or_skip(kw)
    assert env.observation_space.contains(obs)
    base = env.unwrapped
    assert base.m == (cfg.env.num_instances or len(base.cluster_cfg.engines))
    assert base.cfg.engine.preset == cfg.engine.preset
    assert base.cfg.reward.mode == cfg.reward.mode
    env.close()


@pytest.mark.parametrize("format", sorted(TRACE_FIXTURES))
def test_trace_config_replays_every_format_without_plus(format):
    """``workload=trace workload.path=... workload.format=...`` (no ``+``) for every reader,
    then an episode that accounts for every request of the file."""
    path = FIXTURES / TRACE_FIXTURES[format]
    cfg = _compose(["workload=trace", f"workload.path={path}", f"workload.format={format}",
                    "workload.start=head"])
    kw = env_kwargs(cfg)
    kw["num_requests"] = 23   # the failed BurstGPT row is dropped: 23 requests in each file
    env = gym.make("LLMCluster-v0", **kw)
    base = env.unwrapped
    _, info = env.reset(seed=0)
    done = False
    while not done:
        _, _, term, trunc, info = env.step(base.m if not info["action_mask"][:base.m].any()
                                           else int(info["action_mask"][:base.m].argmax()))
        done = term or trunc
    metrics = info["metrics"]
    assert metrics["completed"] + metrics["rejected"] == 23
    workload = base.workload
    assert workload.path == str(path) and workload.format == format
    assert workload.arrivals is None if format != "lengths" else workload.arrivals.rate_rps == cfg.env.arrival_rate_rps


@pytest.mark.parametrize("missing", ["path", "format"])
def test_trace_config_names_what_is_missing(missing):
    from omegaconf.errors import MissingMandatoryValue

    given = {"path": f"workload.path={FIXTURES / TRACE_FIXTURES['azure']}", "format": "workload.format=azure"}
    cfg = _compose(["workload=trace", *(v for k, v in given.items() if k != missing)])
    with pytest.raises(MissingMandatoryValue, match=f"workload.{missing}"):
        env_kwargs(cfg)


def test_every_registered_trace_has_a_workload_config():
    from llm_lb_gym.data import trace_datasets

    for name in trace_datasets():
        assert OmegaConf.load(CONF / "workload" / f"{name}.yaml").name == name


def test_experiment_files_are_global_packages():
    """lightning-hydra-template style: experiments override only what they change, globally."""
    for option in _options("experiment"):
        first = (CONF / "experiment" / f"{option}.yaml").read_text().splitlines()[0]
        assert first == "# @package _global_", option


MODEL_PREDICTORS = ("transformer", "light", "forest")
"""Predictors that load a trained model (seconds each): their options are checked against the
factory's signature here; loading them is tests/test_predictor_models.py's job."""


@pytest.mark.parametrize("option", _options("predictor"))
def test_predictor_group_composes_and_builds(option):
    import inspect

    from llm_lb_gym.envs.builders import build_predictor
    from llm_lb_gym.predictor.registry import PREDICTORS

    cfg = _compose([f"predictor={option}"])
    spec = to_container(cfg.predictor)
    name = spec.pop("name")
    assert name in PREDICTORS
    params = set(inspect.signature(PREDICTORS[name]).parameters) | {"calibration"}   # every predictor's
    assert set(spec) <= params, f"predictor={option}: unknown options {set(spec) - params}"
    if name in MODEL_PREDICTORS:
        return
    path = spec.get("path")
    if path and not Path(path).exists():
        pytest.skip(f"predictor {option} needs its trained artifact at {path}")
    assert hasattr(build_predictor({"name": name, **spec}), "predict")


@pytest.mark.parametrize("option", _options("agent"))
def test_agent_group_composes_and_builds(option):
    from llm_lb_gym.agents import agent_class, make_agent, predict_action

    cfg = _compose([f"agent={option}"])
    env = gym.make("LLMCluster-v0", num_requests=20)
    agent = make_agent(cfg.agent.name, env, total_timesteps=1000, episode_steps=100, seed=0,
                       **to_container(cfg.agent.kwargs))
    assert isinstance(agent, agent_class(cfg.agent.name))
    obs, info = env.reset(seed=0)
    assert 0 <= predict_action(agent, obs, info["action_mask"]) <= env.unwrapped.m


def test_experiment_list_composes_debug_on_top():
    """``experiment=[setting,debug]`` shrinks a paper setting and keeps what debug leaves alone."""
    cfg = _compose(["experiment=[paper_v100_kv_limited,debug]"])
    assert cfg.env.num_requests == 60
    assert (cfg.engine.preset, cfg.engine.max_model_len) == ("llama2-7b-v100-16gb", 1024)
    assert cfg.train.episodes == 4


def test_paper_settings_are_what_the_paper_ran():
    v100 = _compose(["experiment=paper_v100"])
    assert (v100.env.num_instances, v100.env.num_requests, v100.env.arrival_rate_rps) == (4, 2000, 20.0)
    assert v100.engine.preset == "llama2-7b-v100" and v100.eval.episodes == 20
    a100 = _compose(["experiment=paper_a100_llama3_chunked"])
    assert a100.engine.preset == "llama3-8b-a100" and a100.engine.chunked_prefill
    assert a100.env.arrival_rate_rps == 80.0
    eight = _compose(["experiment=paper_8x_v100"])
    assert (eight.env.num_instances, eight.env.num_requests, eight.env.arrival_rate_rps) == (8, 4000, 40.0)


def test_variants_are_reward_modes():
    cfgs = {mode: _compose([f"reward={mode}"]) for mode in ("baseline", "workload_aware", "workload_guided")}
    for mode, cfg in cfgs.items():
        assert cfg.reward.mode == mode
    rep = _compose([], config_name="reproduce")
    assert {v.reward for v in rep.variants.values() if v.get("reward")} == set(cfgs)
    for setting in list(rep.settings) + list(rep.paper) + list(rep.paper_as):
        assert (CONF / "experiment" / f"{setting}.yaml").exists(), setting
    for v in rep.variants.values():   # a variant beyond the paper names its experiment(s)
        if not v.get("reward"):
            names = [v.experiment] if isinstance(v.experiment, str) else list(v.experiment)
            assert all((CONF / "experiment" / f"{n}.yaml").exists() for n in names), v
        assert v.get("trainer", "train") in ("train", "improve"), v


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local", "submitit_slurm", "local_parallel",
                                      "slurm_cpu"])
def test_launcher_presets_compose(launcher):
    cfg = _compose([f"hydra/launcher={launcher}"], hydra_cfg=True)
    target = cfg.hydra.launcher._target_
    assert ("Joblib" in target) or ("Submitit" in target) or ("submitit" in target)


def test_ray_preset_names_the_ray_launcher():
    """The Ray preset needs hydra-ray-launcher (not installed here): check what it asks for."""
    ray = OmegaConf.load(CONF / "hydra" / "launcher" / "ray_cluster.yaml")
    assert "ray" in str(OmegaConf.to_container(ray)["defaults"])


def test_train_options_are_validated():
    from llm_lb_gym.experiments.train import _check_train_cfg

    cfg = _compose(["train.final_model=newest"])
    with pytest.raises(ConfigError, match="train.final_model.*best, last"):
        _check_train_cfg(cfg)
    cfg = _compose(["agent=reinforce", "train.n_envs=2"])
    with pytest.raises(ConfigError, match="train.n_envs"):
        _check_train_cfg(cfg)
