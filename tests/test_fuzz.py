"""Fuzz: random valid and invalid options and trace files (issue 10, item 8).

Construction either succeeds or raises one of the package's named errors (never a bare
AssertionError, KeyError, IndexError, ZeroDivisionError, OverflowError or a numpy warning), and
every episode that runs ends within its step limit and a bounded wall time with
completed + rejected + unfinished == num_requests.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings

import gymnasium as gym
import pytest
import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import llm_lb_gym  # noqa: F401
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.data import CorpusError
from llm_lb_gym.workload import TraceFormatError

NAMED_ERRORS = (ConfigError, TraceFormatError, CorpusError)   # ArrivalLimitError is a ConfigError
STEP_LIMIT = 400
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", 150))
"""Examples per test; ``FUZZ_EXAMPLES=2000 pytest tests/test_fuzz.py`` for a deeper search."""
WALL_LIMIT_S = 30.0
# Gymnasium's checker may flag observations outside the Box for adversarial (but valid)
# observation scales; everything else that warns is a failure.
ALLOWED_WARNINGS = ("not within the observation space",
                    "exceeds max_episode_steps")   # said once when num_requests > the step limit

ADVERSARIAL = st.sampled_from([
    0, -1, 1, 2, 7, 0.5, -0.5, 2.7, 1e-300, 1e300, 1e19, 2**63, -(2**63), math.nan, math.inf,
    -math.inf, "1", "x", "", True, False, None, [1], {"a": 1}, 1e-4, 0.02, 3.0])

VALID = {
    ("num_instances",): st.integers(1, 6),
    ("arrival_rate_rps",): st.floats(0.5, 200.0),
    ("decision_interval_s",): st.floats(1e-3, 2.0),
    ("one_action_per_interval",): st.booleans(),
    ("fast",): st.booleans(),
    ("engine", "max_num_seqs"): st.integers(1, 256),
    ("engine", "num_kv_blocks"): st.integers(280, 3000),
    ("engine", "watermark"): st.floats(0.0, 0.5),
    ("engine", "block_size"): st.sampled_from([8, 16, 32]),
    ("engine", "scheduler"): st.sampled_from(["fcfs", "least_work_left", "bin_packing"]),
    ("engine", "chunked_prefill"): st.booleans(),
    ("engine", "max_num_batched_tokens"): st.sampled_from([None, 512, 4096, 8192]),
    ("reward", "completion_reward"): st.floats(0.0, 100.0),
    ("reward", "guidance_scale"): st.floats(0.0, 5.0),
    ("reward", "decay"): st.floats(0.0, 2.0),
    ("reward", "penalty_scale"): st.floats(0.0, 10.0),
    ("reward", "mode"): st.sampled_from(["baseline", "workload_aware", "workload_guided"]),
    ("reward", "mixing", "eps_s"): st.floats(0.01, 5.0),
    ("reward", "mixing", "alpha"): st.floats(0.0, 1.0),
    ("obs", "queue_cap"): st.integers(1, 600),
    ("obs", "time_scale_s"): st.floats(0.1, 100.0),
    ("obs", "normalize"): st.booleans(),
    ("workload", "rate_rps"): st.floats(0.5, 100.0),
    ("workload", "max_prompt_tokens"): st.integers(50, 1000),
}


def _set(d: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        d = d.setdefault(key, {})
    d[path[-1]] = value


@st.composite
def option_dicts(draw):
    opts: dict = {"workload": {"name": "task_mix"}}
    paths = draw(st.lists(st.sampled_from(sorted(VALID)), max_size=8, unique=True))
    for path in paths:
        bad = draw(st.booleans()) and draw(st.booleans())     # a quarter of the values
        _set(opts, path, draw(ADVERSARIAL if bad else VALID[path]))
    opts["num_requests"] = draw(st.integers(1, 25) | ADVERSARIAL if draw(st.booleans()) and
                                draw(st.booleans()) else st.integers(1, 25))
    return opts


@st.composite
def trace_files(draw):
    """A small mooncake JSONL, lengths CSV or Azure CSV: unsorted, duplicate and far-apart
    timestamps; in half of the files one cell holds an adversarial value."""
    fmt = draw(st.sampled_from(["mooncake", "lengths", "azure"]))
    n = draw(st.integers(1, 12))
    rows = []
    clock = 0.0
    for _ in range(n):
        kind = draw(st.sampled_from(["next", "next", "same", "back", "gap"]))
        if kind == "next":
            clock += draw(st.floats(0.0, 2000.0))
        elif kind == "back":
            clock -= 500.0
        elif kind == "gap":
            clock += draw(st.sampled_from([1e5, 1e8, 9e8, 3.6e9, 1e12]))
        rows.append([clock, draw(st.integers(1, 3000)), draw(st.integers(1, 600))])
    if draw(st.booleans()):
        rows[draw(st.integers(0, n - 1))][draw(st.integers(0, 2))] = draw(ADVERSARIAL)
    return fmt, rows


def _write_trace(tmp_path, fmt, rows) -> str:
    if fmt == "mooncake":
        path = tmp_path / "fuzz.jsonl"
        lines = []
        for t, p, d in rows:
            try:
                lines.append(json.dumps({"timestamp": t, "input_length": p, "output_length": d}))
            except (TypeError, ValueError):
                lines.append(f'{{"timestamp": "{t}", "input_length": 1, "output_length": 1}}')
        path.write_text("\n".join(lines) + "\n")
    elif fmt == "lengths":
        path = tmp_path / "fuzz.csv"
        path.write_text("num_prefill_tokens,num_decode_tokens\n"
                        + "".join(f"{p},{d}\n" for _, p, d in rows))
    else:
        path = tmp_path / "fuzz_azure.csv"
        base = np.datetime64("2023-11-16T18:00:00", "ns")

        def stamp(t):
            try:
                return str(base + np.timedelta64(int(float(t) * 1e9), "ns")).replace("T", " ")
            except (TypeError, ValueError, OverflowError):
                return str(t)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # building the adversarial file, not under test
            text = "".join(f"{stamp(t)},{p},{d}\n" for t, p, d in rows)
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + text)
    return str(path)


def _episode(options: dict, step_limit: int = STEP_LIMIT) -> None:
    """Build, run one episode under the step limit, check the accounting; named errors pass."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for message in ALLOWED_WARNINGS:
            warnings.filterwarnings("ignore", message=f".*{message}.*")
        try:
            env = gym.make("LLMCluster-v0", max_episode_steps=step_limit, **options)
            obs, info = env.reset(seed=0)
        except NAMED_ERRORS as err:
            event(f"rejected: {type(err).__name__}")
            return
        n = env.unwrapped.cfg.num_requests
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        for steps in range(1, step_limit + 1):
            valid = np.flatnonzero(info["action_mask"])
            obs, reward, terminated, truncated, info = env.step(int(rng.choice(valid)))
            assert math.isfinite(reward), reward
            if terminated or truncated:
                break
        wall = time.perf_counter() - t0
    event("terminated" if terminated else "truncated")
    assert terminated or truncated, "no episode end within the step limit"
    assert wall < WALL_LIMIT_S, f"{steps} steps took {wall:.1f} s"
    m = info["metrics"]
    assert m["completed"] + m["rejected"] + m["unfinished"] == m["num_requests"] == n


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options=option_dicts(), step_limit=st.sampled_from([3, 20, STEP_LIMIT]))
def test_random_options_build_or_fail_by_name_and_episodes_account_for_every_request(options,
                                                                                    step_limit):
    _episode(options, step_limit)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(trace=trace_files(), rate_scale=st.one_of(st.floats(1e-3, 1e3), ADVERSARIAL),
       start=st.sampled_from(["head", "random"]), n=st.integers(1, 20))
def test_random_trace_files_build_or_fail_by_name(tmp_path, trace, rate_scale, start, n):
    fmt, rows = trace
    path = _write_trace(tmp_path, fmt, rows)
    workload = {"name": "trace", "path": path, "format": fmt, "start": start}
    if fmt == "lengths":
        workload["rate_rps"] = 5.0
    else:
        workload["rate_scale"] = rate_scale
    _episode({"workload": workload, "num_requests": n, "num_instances": 2})


# -- entry-point options (issue 22, class 4) ----------------------------------------------------
# Every option an entry point reads gets the env options' treatment: a value of the wrong type,
# range or set raises ConfigError naming the option; nothing of the standard library or numpy
# (ValueError from int("x"), IndexError from an empty seed list, ...) escapes.
EVAL_VALID = {
    "episodes": st.integers(1, 3),
    "seed": st.integers(0, 2**40),
    "policies": st.lists(st.sampled_from(["round_robin", "jsq", "random", "late_binding"]),
                         min_size=1, max_size=3, unique=True),
    "baseline": st.just("round_robin"),
    "policy_options": st.sampled_from([None, {}, {"late_binding": {"period_s": 0.5}}]),
    "plot": st.booleans(),
}
EVAL_BAD = st.one_of(ADVERSARIAL, st.sampled_from([
    [], ["round_robin", "round_robin"], ["no_such_router"], "jsq", ["jsq", 3],
    {"no_such_router": {}}, {"jsq": {"no_such_option": 1}}, {"jsq": 3}, "no_such_policy"]))


def _evaluate_cfg(values: dict):
    from omegaconf import OmegaConf

    base = {"episodes": 1, "seed": 0, "policies": ["round_robin"], "baseline": "round_robin",
            "policy_options": None, "agents": {}, "plot": False, "progress": False,
            "env": {"num_requests": 10}}
    return OmegaConf.create({**base, **values})


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), keys=st.lists(st.sampled_from(sorted(EVAL_VALID)), max_size=4, unique=True))
def test_evaluate_options_pass_or_fail_by_name(data, keys):
    from llm_lb_gym.experiments._entry_options import check_evaluate_options

    values, bad = {}, []
    for key in keys:
        if data.draw(st.booleans()):
            values[key] = data.draw(EVAL_BAD)
            bad.append(key)
        else:
            values[key] = data.draw(EVAL_VALID[key])
    if "baseline" not in values and "policies" in values and isinstance(values["policies"], list) \
            and "round_robin" not in values["policies"]:
        values["baseline"] = values["policies"][0] if values["policies"] else "round_robin"
    try:
        cfg = _evaluate_cfg(values)
    except Exception as err:   # OmegaConf itself refuses some values (e.g. a set): not ours
        event(f"omegaconf: {type(err).__name__}")
        return
    try:
        check_evaluate_options(cfg)
    except ConfigError as err:
        named = [k for k in (*bad, "baseline", "policy_options", "router") if k in str(err)]
        assert named, f"error names no option: {err}"
        event("rejected")
        return
    event("accepted")


@pytest.mark.parametrize("override, option", [
    ({"episodes": 0}, "episodes"), ({"episodes": 2.5}, "episodes"), ({"episodes": -1}, "episodes"),
    ({"policies": []}, "policies"), ({"baseline": "no_such"}, "baseline"),
    ({"seed": 1.5}, "seed"), ({"policies": "jsq"}, "policies"),
])
def test_evaluate_rejects_bad_options_before_running(tmp_path, override, option):
    from llm_lb_gym.experiments.evaluate import evaluate

    with pytest.raises(ConfigError, match=option):
        evaluate(_evaluate_cfg(override), out=tmp_path / "run")
    assert not (tmp_path / "run").exists()   # nothing written, nothing run


RESET_VALUES = st.one_of(ADVERSARIAL, st.integers(0, 50), st.integers(-5, -1))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options=st.one_of(
    st.none(), ADVERSARIAL,
    st.dictionaries(st.sampled_from(["guidance_episode", "batch", "guidance_epsiode", "seed", ""]),
                    RESET_VALUES, max_size=2)))
def test_reset_options_pass_or_fail_by_name(options):
    env = gym.make("LLMCluster-v0", num_requests=8)
    try:
        env.reset(seed=0, options=options)
    except ConfigError as err:
        assert "reset" in str(err), err
        event("rejected")
        return
    event("accepted")
    k = (options or {}).get("guidance_episode") if isinstance(options, dict) else None
    if k is not None:
        assert isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 0
        assert env.unwrapped.guidance_episode == k


@settings(max_examples=EXAMPLES, deadline=None)
@given(k=RESET_VALUES)
def test_set_training_episode_passes_or_fails_by_name(k):
    env = gym.make("LLMCluster-v0", num_requests=8, reward={"mode": "workload_guided"})
    try:
        env.unwrapped.set_training_episode(k)
    except ConfigError as err:
        assert "set_training_episode" in str(err), err
        return
    _, info = env.reset(seed=0)
    assert env.unwrapped.guidance_episode == k and 0.0 <= env.unwrapped._w <= 5.0


def test_reset_batch_must_fit_the_episode():
    from llm_lb_gym.workload import RequestBatch

    env = gym.make("LLMCluster-v0", num_requests=2)
    big = RequestBatch.from_arrays([0.0, 0.1, 0.2], [10, 10, 10], [5, 5, 5])
    with pytest.raises(ConfigError, match="batch has 3 requests; allowed: 1 to num_requests=2"):
        env.reset(seed=0, options={"batch": big})
    empty = RequestBatch.from_arrays([], [], [])
    with pytest.raises(ConfigError, match="batch has 0 requests"):
        env.reset(seed=0, options={"batch": empty})   # was falsy: silently sampled instead


@pytest.mark.parametrize("override, option", [
    ({"load_factors": []}, "load_factors"), ({"load_factors": [0.5, -1]}, r"load_factors\[1\]"),
    ({"load_factors": "2"}, "load_factors"), ({"load_factors": [1, 1.0]}, "twice"),
    ({"episodes": 0}, "episodes"), ({"baseline": "jsq"}, "baseline"),
])
def test_load_sweep_rejects_bad_options_before_measuring(tmp_path, override, option):
    from llm_lb_gym.experiments.load_sweep import load_sweep

    cfg = _evaluate_cfg({"load_factors": [0.5, 1.0], **override})
    with pytest.raises(ConfigError, match=option):
        load_sweep(cfg, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()
