"""The env's compiled step kernels (llm_lb_gym/envs/step_kernels.pyx) against their plain-Python
references: the same observation arrays bit for bit, the same guidance term and idle test, at
every step of whole episodes; and the choice between them (llm_lb_gym/envs/_kernels.py)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import llm_lb_gym.sim.cluster as cluster_mod
from llm_lb_gym.envs import LLMClusterEnv, _kernels
from llm_lb_gym.envs.reward import guidance_term
from llm_lb_gym.routers.mixing import MixingParams
from llm_lb_gym.sim import _compiled
from llm_lb_gym.sim.engine import Engine as PureEngine

KERNELS = _kernels.compiled_kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="no compiled env kernels")


def test_kernels_are_built_and_current():
    """Built with the engine by the install; a silent fallback would slow every env step."""
    if _compiled.pure_python_forced():
        pytest.skip("LLM_LB_GYM_PURE_PYTHON is set: plain Python on purpose")
    assert KERNELS is not None, (
        "llm_lb_gym.envs._step_kernels_c is missing or stale: reinstall with `pip install -e .`")


@needs_kernels
def test_stale_kernels_are_ignored_with_a_warning(monkeypatch):
    monkeypatch.setattr(_kernels, "source_digest", lambda: "0" * 64)
    _kernels.compiled_kernels.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="another version"):
            assert _kernels.compiled_kernels() is None
    finally:
        monkeypatch.undo()
        _kernels.compiled_kernels.cache_clear()
    assert _kernels.compiled_kernels() is not None


def _episode_states(seed, **options):
    """Yield the env at every decision of a random-action episode."""
    env = LLMClusterEnv(**options)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    done = False
    while not done:
        yield env
        _, _, term, trunc, _ = env.step(int(rng.integers(env.action_space.n)))
        done = term or trunc
    yield env


@needs_kernels
@pytest.mark.parametrize("options", [
    {"num_requests": 300},
    {"num_requests": 200, "engine": {"num_kv_blocks": 72}},                       # preemptions
    {"num_requests": 200, "arrival_rate_rps": 60.0, "obs": {"normalize": False}},
    {"num_requests": 200, "arrival_rate_rps": 60.0, "obs": {"features": ["arrivals_left"]},
     "action": {"candidates": 3}},
    {"num_requests": 200, "arrival_rate_rps": 60.0, "action": {"candidates": 4, "order": "shortest"},
     "obs": {"prompt_edges_tokens": [128, 512, 1024], "queue_cap": 8}},
    {"num_requests": 150, "arrival_rate_rps": 80.0, "obs": {"queue_cap": 2**63}},   # no C long
    {"num_requests": 200, "engine": {"chunked_prefill": True, "max_num_batched_tokens": 512}},
], ids=["default", "tight_kv", "raw", "arrivals_k3", "shortest_k4_buckets", "huge_queue_cap",
        "chunked"])
def test_compiled_observation_equals_python_bit_for_bit(options):
    steps = 0
    for env in _episode_states(3, **options):
        ob = env.obs_builder
        fast = ob.observer(env.cluster)
        assert fast != ob.observe, "the compiled kernel applies to this layout"
        want = ob.observe(env.cluster, env._cands)
        got = fast(env.cluster, env._cands)
        assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
        assert got.tobytes() == want.tobytes(), steps
        assert got is not fast(env.cluster, env._cands)   # a new array every time
        steps += 1
    assert steps > 100


@needs_kernels
@pytest.mark.parametrize("params", [MixingParams(), MixingParams(grad1=1e-5, grad2=2e-4, eps_s=0.05, alpha=0.3)])
def test_compiled_guidance_and_idle_test_equal_python(params):
    mix = KERNELS.MixingGuidance(params.grad1, params.grad2, params.eps_s, params.alpha)
    from llm_lb_gym.envs.config import RewardConfig
    cfg = RewardConfig(mixing=params)
    checked = 0
    for env in _episode_states(4, num_requests=200, arrival_rate_rps=40.0):
        c = env.cluster
        assert KERNELS.all_idle(c.engines) == all(e.idle() for e in c.engines)
        tb = c.table
        for rid in list(c.queue)[:3]:
            committed = [e.committed_tokens for e in c.engines]
            for i in range(env.m):
                want = guidance_term(committed, tb.prompt[rid], tb.pred[rid], i, cfg)
                assert mix.h(c.engines, tb.prompt[rid], tb.pred[rid], i) == want
                checked += 1
    assert checked > 500
    assert pickle.loads(pickle.dumps(mix)).h(c.engines, 100, 50.0, 0) == mix.h(c.engines, 100, 50.0, 0)


@needs_kernels
def test_layouts_with_extras_and_pure_engines_use_python(monkeypatch):
    env = LLMClusterEnv(num_requests=50, obs={"features": ["free_kv_blocks"]})
    env.reset(seed=0)
    assert env._obs_fn == env.obs_builder.observe
    for obs in ({"round_decimals": 2}, {"as_dict": True}):
        env = LLMClusterEnv(num_requests=50, obs=obs)
        env.reset(seed=0)
        assert env._obs_fn == env.obs_builder.observe
    monkeypatch.setattr(cluster_mod, "engine_class", lambda: PureEngine)
    env = LLMClusterEnv(num_requests=50)
    env.reset(seed=0)
    assert env._obs_fn == env.obs_builder.observe and env._mixing_h is None and env._all_idle is None
    env.step(0)   # the Python path runs


@needs_kernels
def test_compiled_env_pickles_with_its_kernels():
    env = LLMClusterEnv(num_requests=60)
    env.reset(seed=1)
    env.step(0)
    clone = pickle.loads(pickle.dumps(env))
    for a in (1, 2, 3, 0, 4, 1):
        x, y = env.step(a), clone.step(a)
        assert x[0].tobytes() == y[0].tobytes() and x[1] == y[1]
