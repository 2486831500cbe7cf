"""Named regimes (``llm_lb_gym/envs/presets.py``): registered ids, the ``preset=`` keyword, how
keywords override a preset, and that the Hydra experiment built on each preset simulates the
same episodes as ``gym.make`` does."""

from __future__ import annotations

import gymnasium as gym
import pytest

import llm_lb_gym
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs.presets import PREDICTOR, PRESETS, apply_preset, preset_options

SMALL = 120   # requests per episode in these tests


def test_every_preset_has_its_registered_id():
    assert {p.env_id: p.name for p in PRESETS.values()} == llm_lb_gym.ENV_IDS
    for env_id, name in llm_lb_gym.ENV_IDS.items():
        assert gym.spec(env_id).kwargs == {"preset": name}
        assert gym.spec(env_id).max_episode_steps == gym.spec(llm_lb_gym.ENV_ID).max_episode_steps
    assert gym.spec(llm_lb_gym.ENV_ID).kwargs == {}   # LLMCluster-v0 stays the paper's setting


def test_near_capacity_id_and_keyword_build_the_same_env():
    by_id = gym.make("LLMCluster-NearCapacity-v0", num_requests=SMALL).unwrapped
    by_kw = gym.make("LLMCluster-v0", preset="near_capacity", num_requests=SMALL).unwrapped
    assert by_id.cfg == by_kw.cfg and by_id.preset == "near_capacity"
    assert by_id.cfg.arrival_rate_rps == 52.0 and by_id.cfg.num_requests == SMALL
    assert by_id.cfg.predictor == dict(PREDICTOR)   # deployable, not the oracle
    assert by_id.cfg.reward.penalty == "latency" and by_id.cfg.reward.mode == "baseline"   # REWARD
    assert gym.make("LLMCluster-v0").unwrapped.cfg.arrival_rate_rps == 20.0


def test_keywords_override_the_preset_key_by_key():
    kw = apply_preset("overload", {"engine": {"scheduler": "bin_packing"}, "reward": {"mode": "baseline"}})
    assert kw["engine"] == {"preset": "llama2-7b-v100-16gb", "max_model_len": 1024, "scheduler": "bin_packing"}
    assert kw["reward"] == {"mode": "baseline", "penalty": "latency", "completion_reward": 0.0, "horizon_s": 120.0}
    assert apply_preset("near_capacity", {"reward": {"mode": "workload_guided"}})["reward"]["mode"] == "workload_guided"
    # a workload or predictor of another name brings its own options; the same name merges
    assert apply_preset("trace", {"workload": "task_mix"})["workload"] == "task_mix"
    assert apply_preset("trace", {"workload": {"rate_scale": 5.0}})["workload"] == {
        "name": "azure_conv", "rate_scale": 5.0, "start": "random"}
    assert apply_preset("near_capacity", {"predictor": {"name": "oracle"}})["predictor"] == {"name": "oracle"}
    assert apply_preset("near_capacity", {"predictor": {"accuracy": 0.5}})["predictor"] == {
        **PREDICTOR, "accuracy": 0.5}
    # a mixed cluster sizes itself
    mixed = apply_preset("near_capacity", {"instances": [{"preset": "llama2-7b-v100", "count": 2}]})
    assert "num_instances" not in mixed
    # the preset's own values are never changed by a call
    assert preset_options("overload")["engine"] == {"preset": "llama2-7b-v100-16gb", "max_model_len": 1024}


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ConfigError, match="preset='nope' is not valid; allowed: near_capacity, overload, trace"):
        gym.make("LLMCluster-v0", preset="nope")


def _round_robin(env, seed=3):
    from llm_lb_gym.envs.router_factory import make_env_router
    from llm_lb_gym.rollout import rollout_router

    return rollout_router(env, make_env_router("round_robin", env), seed).metrics


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_experiment_on_a_preset_simulates_the_same_episodes(name):
    """``conf/experiment/<experiment>.yaml`` takes its regime from the preset: with the
    experiment's predictor and reward groups, ``gym.make`` of the id gives the same cluster,
    reward configuration and round-robin episode, bit for bit."""
    pytest.importorskip("hydra")
    from llm_lb_gym.experiments._hydra import compose, env_kwargs

    p = PRESETS[name]
    kw = env_kwargs(compose("evaluate", [f"experiment={p.experiment}", f"env.num_requests={SMALL}"]))
    kw.pop("max_episode_steps", None)
    try:
        hydra_env = gym.make("LLMCluster-v0", **kw).unwrapped
    except FileNotFoundError as exc:   # the trace preset reads a dataset that may be absent
        pytest.skip(f"{p.needs_data}: {exc}")
    preset_env = gym.make(p.env_id, num_requests=SMALL, predictor=kw["predictor"],
                          reward=kw["reward"]).unwrapped
    assert preset_env.cluster_cfg == hydra_env.cluster_cfg
    assert preset_env.cfg.reward == hydra_env.cfg.reward
    assert (preset_env.cfg.arrival_rate_rps, preset_env.cfg.slo, preset_env.cfg.obs) == \
        (hydra_env.cfg.arrival_rate_rps, hydra_env.cfg.slo, hydra_env.cfg.obs)
    assert _round_robin(preset_env) == _round_robin(hydra_env)


def test_preset_hydra_node_puts_each_option_in_its_group():
    pytest.importorskip("hydra")
    from llm_lb_gym.experiments._hydra import preset_node

    node = preset_node("overload")
    assert node["env"] == {"num_instances": 4, "num_requests": 2000, "arrival_rate_rps": 20.0}
    assert node["engine"]["preset"] == "llama2-7b-v100-16gb" and node["reward"] == {"horizon_s": 120.0}
    assert "predictor" not in node   # an experiment keeps its own predictor group


def test_a_preset_env_passes_gymnasiums_checker():
    from gymnasium.utils.env_checker import check_env

    env = gym.make("LLMCluster-Overload-v0", num_requests=40)
    check_env(env.unwrapped, skip_render_check=True)
