"""Every numeric option is checked for type and finiteness at construction (issue 10, item 6)."""

from __future__ import annotations

from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest

import llm_lb_gym  # noqa: F401
from llm_lb_gym._validate import ConfigError, check_bool, check_int, check_range
from llm_lb_gym.envs import LLMClusterEnv
from llm_lb_gym.limits import MAX_TOKENS
from llm_lb_gym.routers.drive import run_router
from llm_lb_gym.routers.registry import make_router
from llm_lb_gym.sim.config import ClusterConfig
from llm_lb_gym.workload import GammaArrivals, RequestBatch, TraceArrivals


@pytest.mark.parametrize("value", ["20", b"1", True, False, np.bool_(True), None, [1], 1j,
                                   np.array([1.0])])
def test_check_range_rejects_non_numbers(value):
    with pytest.raises(ConfigError, match=r"x=.* is not a number .*allowed: a finite number in"):
        check_range("x", value, 0.0)


@pytest.mark.parametrize("value", [float("inf"), -float("inf"), np.float64("inf")])
def test_check_range_rejects_infinity_unless_allowed(value):
    with pytest.raises(ConfigError, match=r"x=.*inf.* is not finite; allowed: a finite number in"):
        check_range("x", value)
    if value > 0:
        check_range("x", value, 0.0, allow_inf=True)


def test_check_range_nan_huge_ints_and_numpy_scalars():
    with pytest.raises(ConfigError, match="x is NaN"):
        check_range("x", float("nan"), allow_inf=True)
    with pytest.raises(ConfigError, match=r"out of range; allowed: \[0, 10\]"):
        check_range("x", 10**400, 0, 10)          # no OverflowError from float()
    for ok in (np.float32(0.5), np.int64(3), Fraction(1, 3), 7):
        check_range("x", ok, 0.0, 10.0)


@pytest.mark.parametrize("value", [2.0, "3", True, np.bool_(False), None, np.float64(2.0)])
def test_check_int_rejects_non_integers(value):
    with pytest.raises(ConfigError, match=r"n=.* must be an integer; allowed: integers in \[1, inf\)"):
        check_int("n", value, 1)
    check_int("n", np.int32(4), 1)


def test_check_bool():
    check_bool("b", np.bool_(True))
    for bad in ("False", 0, None):
        with pytest.raises(ConfigError, match="must be a bool"):
            check_bool("b", bad)


# The issue's cases, through gym.make: a ConfigError naming the option and what is allowed.
ISSUE_CASES = [
    (dict(decision_interval_s=float("inf")), r"decision_interval_s=inf is not finite"),
    (dict(decision_interval_s=1e-9), r"decision_interval_s=1e-09 is out of range; allowed: \[0.0001"),
    (dict(arrival_rate_rps=float("inf")), r"arrival_rate_rps=inf is not finite"),
    (dict(arrival_rate_rps="20"), r"arrival_rate_rps='20' is not a number \(str\)"),
    (dict(arrival_rate_rps=float("nan")), r"arrival_rate_rps is NaN"),
    (dict(arrival_rate_rps=True), r"arrival_rate_rps=True is not a number \(bool\)"),
    (dict(workload={"name": "azure_conv", "rate_scale": float("inf")}), r"rate_scale=inf is not finite"),
    (dict(workload={"name": "azure_conv", "rate_scale": 0.0}), r"rate_scale=0.0 is out of range"),
    (dict(workload={"name": "task_mix", "arrival": "gamma", "cv": float("inf")}), r"cv=inf"),
    (dict(workload={"name": "task_mix", "arrival": "gamma", "cv": 1e-9}), r"cv=1e-09 is out of range"),
    (dict(workload={"name": "task_mix", "max_context_tokens": 10**19}), r"max_context_tokens="),
    (dict(num_requests=2.0), r"num_requests=2.0 must be an integer"),
    (dict(num_requests=2**63), r"num_requests=\d+ is out of range; allowed: \[1, 10000000\]"),
    (dict(num_instances=5000), r"num_instances=5000 is out of range; allowed: \[1, 1024\]"),
    (dict(obs={"time_scale_s": 1e300}), r"obs.time_scale_s=1e\+300 is out of range"),
    (dict(num_instances="4"), r"num_instances='4' must be an integer"),
    (dict(fast="False"), r"fast='False' must be a bool"),
    (dict(one_action_per_interval=1), r"one_action_per_interval=1 must be a bool"),
    (dict(engine={"max_model_len": 2**63}), r"engine.max_model_len=.* out of range"),
    (dict(engine={"max_model_len": 2**20 + 1}), r"engine.max_model_len=1048577 is out of range; allowed: \[2, 1048576\]"),
    (dict(engine={"max_num_batched_tokens": 1e6}), r"engine.max_num_batched_tokens=.* must be an integer"),
    (dict(engine={"num_kv_blocks": MAX_TOKENS + 1}), r"engine.num_kv_blocks="),
    (dict(engine={"gpu_memory_utilization": float("nan")}), r"engine.gpu_memory_utilization is NaN"),
    (dict(engine={"chunked_prefill": "yes"}), r"engine.chunked_prefill='yes' must be a bool"),
    (dict(engine={"latency": dict(base_s=0.0, token_s=0.0, prefill_attn_s=0.0,
                                  decode_seq_s=0.0, decode_ctx_s=0.0)}), r"latency.base_s=0.0"),
    (dict(engine={"latency": dict(base_s=0.01, token_s=float("inf"), prefill_attn_s=0.0,
                                  decode_seq_s=0.0, decode_ctx_s=0.0)}), r"latency.token_s=inf"),
    (dict(reward={"completion_reward": float("inf")}), r"reward.completion_reward=inf is not finite"),
    (dict(reward={"mixing": {"eps_s": "0.5"}}), r"reward.mixing.eps_s='0.5' is not a number"),
    (dict(obs={"time_scale_s": float("inf")}), r"obs.time_scale_s=inf is not finite"),
    (dict(obs={"prompt_edges_tokens": (256, 2.7)}), r"obs.prompt_edges_tokens\[1\]=2.7 must be an integer"),
    (dict(obs={"decode_edges_tokens": 256}), r"obs.decode_edges_tokens=256 must be a sequence"),
    (dict(obs={"normalize": "no"}), r"obs.normalize='no' must be a bool"),
    (dict(predictor={"name": "noisy", "accuracy": float("nan")}), r"noisy.accuracy is NaN"),
]


@pytest.mark.parametrize("options,pattern", ISSUE_CASES)
def test_bad_options_fail_at_construction_naming_option_and_range(options, pattern):
    with pytest.raises(ConfigError, match=pattern):
        gym.make("LLMCluster-v0", **options)


def test_arrival_objects_and_drivers_validate_too():
    with pytest.raises(ConfigError, match=r"rate_rps=inf is not finite"):
        GammaArrivals(float("inf"))
    with pytest.raises(ConfigError, match=r"rate_scale=nan|rate_scale is NaN"):
        TraceArrivals(np.array([0.0, 1.0]), rate_scale=float("nan"))
    batch = RequestBatch.from_arrays([0.0], [10], [5])
    for bad, pattern in ((float("inf"), "not finite"), (1e-7, r"allowed: 0.0 or \[0.0001")):
        with pytest.raises(ConfigError, match=f"decision_interval_s=.*{pattern}"):
            run_router(batch, ClusterConfig(num_instances=1), make_router("round_robin"),
                       np.random.default_rng(0), decision_interval_s=bad)


def test_valid_numpy_and_integer_valued_options_still_work():
    env = LLMClusterEnv(num_requests=np.int64(20), arrival_rate_rps=np.float32(10.0),
                        decision_interval_s=1, obs={"prompt_edges_tokens": [np.int64(300)]},
                        fast=np.bool_(True))
    env.reset(seed=0)
    env.step(0)
    # ... and each took effect, as the plain Python values would
    ref = LLMClusterEnv(num_requests=20, arrival_rate_rps=10.0, decision_interval_s=1.0,
                        obs={"prompt_edges_tokens": [300]}, fast=True)
    ref.reset(seed=0)
    ref.step(0)
    assert len(env.batch) == 20 and env.cfg.decision_interval_s == 1.0
    assert tuple(env.obs_builder.prompt_scheme.edges_tokens) == (300,)
    np.testing.assert_array_equal(env.batch.arrival_s, ref.batch.arrival_s)
    np.testing.assert_array_equal(env._observe(), ref._observe())
