"""The Cython build of the engine: present after the README install, current, and bit-identical
to the pure-Python engine.py it is compiled from (llm_lb_gym/sim/_compiled.py)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import llm_lb_gym.sim.cluster as cluster_mod
from llm_lb_gym.envs import LLMClusterEnv
from llm_lb_gym.sim import _compiled
from llm_lb_gym.sim.engine import Engine as PureEngine

COMPILED = _compiled.compiled_engine_class()


def test_compiled_engine_is_built_and_current():
    """The install compiles the engine (a C compiler and Python headers are on every supported
    machine); a silent fallback would halve env speed, so it fails here. Set
    LLM_LB_GYM_PURE_PYTHON=1 to install and test without it on purpose."""
    if _compiled.pure_python_forced():
        pytest.skip("LLM_LB_GYM_PURE_PYTHON is set: pure-Python engine on purpose")
    assert COMPILED is not None, (
        "llm_lb_gym.sim._engine_c is missing or stale: reinstall with `pip install -e .` and "
        "read its log for 'llm_lb_gym setup:' lines")
    assert _compiled.implementation() == "compiled"


def test_stale_build_is_ignored_with_a_warning(monkeypatch):
    if COMPILED is None:
        pytest.skip("no compiled engine")
    monkeypatch.setattr(_compiled, "source_digest", lambda directory=None: "0" * 64)
    with pytest.warns(RuntimeWarning, match="another version"):
        assert _compiled.compiled_engine_class() is None


def test_env_var_forces_pure_python(monkeypatch):
    monkeypatch.setenv(_compiled.PURE_ENV_VAR, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compiled.compiled_engine_class() is None


def _trajectory(engine_cls, monkeypatch, seed, **options):
    monkeypatch.setattr(cluster_mod, "engine_class", lambda: engine_cls)
    env = LLMClusterEnv(**options)
    obs, _ = env.reset(seed=seed)
    assert type(env.cluster.engines[0]) is engine_cls
    rng = np.random.default_rng(seed)
    rewards, observations = [], [obs]
    done = False
    while not done:
        obs, r, term, trunc, info = env.step(int(rng.integers(env.m + 1)))
        rewards.append(r)
        observations.append(obs)
        done = term or trunc
    tb = env.cluster.table
    columns = {k: list(getattr(tb, k)) for k in (
        "status", "instance", "routed_s", "first_scheduled_s", "first_token_s", "finish_s",
        "preemptions", "reject_reason")}
    if tb.frontends:
        columns.update(seen_first=list(tb.seen_first_token_s), seen_finish=list(tb.seen_finish_s))
    engines = [(e.n_iterations, e.n_prefill_iterations, e.n_preemptions, e.peak_used, e.G)
               for e in env.cluster.engines]
    return rewards, np.stack(observations), info["metrics"], columns, engines


def _same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


@pytest.mark.skipif(COMPILED is None, reason="no compiled engine")
@pytest.mark.parametrize("options", [
    {"num_requests": 300},
    {"num_requests": 300, "engine": {"chunked_prefill": True, "max_num_batched_tokens": 512}},
    {"num_requests": 250, "engine": {"num_kv_blocks": 72}},                       # preemptions
    {"num_requests": 250, "engine": {"num_kv_blocks": 100, "scheduler": "bin_packing"}},
    {"num_requests": 250, "engine": {"num_kv_blocks": 100, "scheduler": "least_work_left",
                                     "chunked_prefill": True}},
    {"num_requests": 200, "fast": False},                                          # reference mode
    {"num_requests": 250, "workload": "conversation", "engine": {"enable_prefix_caching": True,
     "num_kv_blocks": 300}, "obs": {"features": ["cached_prefix"]}},              # prefix caching
    {"num_requests": 250, "workload": "conversation", "engine": {"enable_prefix_caching": True,
     "num_kv_blocks": 300, "chunked_prefill": True, "max_num_batched_tokens": 512}},
    {"num_requests": 250, "engine": {"preset": "llama2-7b-a100", "chunked_prefill": True,   # GEMM tiles,
     "max_num_batched_tokens": 200}, "arrival_rate_rps": 60.0},                    # small-batch decode
    {"num_requests": 250, "engine": {"frontend": {"request_s": 0.02, "prompt_token_s": 2e-5,    # the server's
     "first_token_s": 0.002, "output_token_s": 5e-4}}, "arrival_rate_rps": 40.0},  # frontend
], ids=["default", "chunked", "tight_kv", "bin_packing", "lwl_chunked", "step_mode",
        "prefix_caching", "prefix_caching_chunked", "a100_tiles", "frontend"])
def test_compiled_equals_pure_bit_for_bit(options, monkeypatch):
    pure = _trajectory(PureEngine, monkeypatch, 5, **options)
    comp = _trajectory(COMPILED, monkeypatch, 5, **options)
    assert pure[0] == comp[0]                       # rewards, exactly
    assert np.array_equal(pure[1], comp[1])         # every observation
    assert pure[2] == comp[2] or all(_same(pure[2][k], comp[2][k]) for k in pure[2])
    for k in pure[3]:
        assert all(_same(x, y) for x, y in zip(pure[3][k], comp[3][k])), k
    assert pure[4] == comp[4]
    if options.get("engine", {}).get("num_kv_blocks") == 72:
        assert pure[2]["preemptions"] > 0           # the scenario exercises preemption
    if options.get("engine", {}).get("enable_prefix_caching"):
        assert pure[2]["prefix_hit_rate"] > 0 and pure[2]["prefix_evictions"] > 0


def test_setup_compiles_the_modules_the_runtime_checks():
    """setup.py's MODULES and _compiled.py's name the same files in the same order (a module
    compiled but not checked could run stale; one checked but not compiled disables the build)."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "setup.py").read_text()
    found = re.search(r"^MODULES = (\(.*?\))", text, re.MULTILINE | re.DOTALL)
    assert found and eval(found.group(1)) == _compiled.MODULES
    assert "engine" in _compiled.MODULES


def test_a_missing_compiled_engine_warns_with_cause_and_cost(monkeypatch, tmp_path):
    """A failed compile is never silent: the warning names the cause (the install's record,
    when setup.py left one), the speed cost and the fix; engine_info says which engine runs."""
    import importlib

    import llm_lb_gym

    real = importlib.import_module

    def no_compiled(name, *args):
        if name.endswith("_c") and ".sim._" in name:
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(_compiled.importlib, "import_module", no_compiled)
    monkeypatch.setattr(_compiled, "build_failure", lambda: "compiling llm_lb_gym.sim._engine_c failed (gcc not found)")
    monkeypatch.delenv(_compiled.PURE_ENV_VAR, raising=False)
    _compiled.engine_class.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match=r"not built .*gcc not found.*1\.8x slower.*pip install -v -e \."):
            assert _compiled.engine_class() is PureEngine
        info = llm_lb_gym.engine_info()
        assert info["engine"] == "pure-python" and "gcc not found" in info["reason"]
    finally:
        _compiled.engine_class.cache_clear()   # re-decided (compiled) once the patch is undone


def test_engine_info_says_the_compiled_engine_runs():
    import llm_lb_gym

    assert llm_lb_gym.engine_info() == {"engine": "compiled", "kernels": "compiled", "reason": None,
                                        "build_failure": None}
