"""Long gaps between arrivals: no hang, and a named limit on arrival times (issue 10, item 1)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from llm_lb_gym.envs.cluster_env import LLMClusterEnv
from llm_lb_gym.limits import MAX_ARRIVAL_S, ArrivalLimitError
from llm_lb_gym.sim.clock import grid_index_at_or_after
from llm_lb_gym.workload import (DeterministicArrivals, PoissonArrivals, RequestBatch,
                                 TraceFormatError, TraceWorkload, read_trace)
from llm_lb_gym.workload.arrivals import trace_window

_EPISODE = textwrap.dedent("""
    import sys
    from llm_lb_gym.envs.cluster_env import LLMClusterEnv
    from llm_lb_gym.workload import RequestBatch
    gap, batched = float(sys.argv[1]), sys.argv[2] == "1"
    env = LLMClusterEnv(num_requests=4)
    env._batched_grid = batched
    batch = RequestBatch.from_arrays([0.0, 0.01, gap, gap + 0.5], [100] * 4, [50] * 4)
    obs, info = env.reset(seed=0, options={"batch": batch})
    for steps in range(1, 100):
        a = 0 if info["action_mask"][0] else env.m
        obs, r, term, trunc, info = env.step(a)
        if term:
            break
    assert term and info["metrics"]["completed"] == 4, info
    print(steps, info["time_s"])
""")


@pytest.mark.parametrize("batched", [True, False])
def test_a_gap_of_decades_costs_no_time(batched):
    """A request 15 years after the others used to walk 2.4e10 grid points inside the compiled
    engine (hours, no Ctrl-C); the idle stretch is now skipped in one jump. A subprocess,
    because a hung compiled loop cannot be interrupted from inside."""
    gap = 4.7e8
    out = subprocess.run([sys.executable, "-c", _EPISODE, repr(gap), str(int(batched))],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    steps, t = out.stdout.split()
    assert float(t) >= gap


def test_gap_fast_forward_matches_tick_by_tick():
    """Both fast-forward paths give the same times and metrics over a gap of an hour, and
    rewards equal up to float summation order."""
    batch = RequestBatch.from_arrays([0.0, 0.01, 3600.0, 3600.2], [100, 900, 100, 50],
                                     [300, 50, 40, 20])
    runs = []
    for batched in (True, False):
        env = LLMClusterEnv(num_requests=4)
        env._batched_grid = batched
        _, info = env.reset(seed=0, options={"batch": batch})
        trace = []
        for a in [0, 1, 4, 4, 2, 3, 4, 4, 4]:
            _, r, term, _, info = env.step(a)
            trace.append((r, info["time_s"]))
            if term:
                break
        runs.append((trace, info["metrics"]["mean_e2e_s"]))
    (ta, ea), (tb, eb) = runs
    assert [t for _, t in ta] == [t for _, t in tb] and ea == eb
    assert [r for r, _ in ta] == pytest.approx([r for r, _ in tb], rel=1e-12)


def test_idle_instance_penalty_is_exactly_zero():
    """Once an instance empties, its in-system penalty is 0.0 exactly (no float residue that
    a long gap would multiply)."""
    env = LLMClusterEnv(num_requests=300, arrival_rate_rps=5.0)
    env.reset(seed=1)
    rng = np.random.default_rng(0)
    seen = 0
    done = False
    while not done:
        _, _, done, _, _ = env.step(int(rng.integers(5)))
        for e in env.cluster.engines:
            if e.idle():
                seen += 1
                assert e.penalty() == 0.0
    assert seen > 0


def test_grid_search_terminates_for_huge_times():
    assert grid_index_at_or_after(1.0, 0.02, 0) == 50
    assert grid_index_at_or_after(0.0, 0.02, 3) == 3
    assert grid_index_at_or_after(1e9, 0.02, 0) * 0.02 >= 1e9
    for t in (1.9e14, 1e300, float("inf")):   # the old `while k1 * dt < t` never ended here
        with pytest.raises(ArrivalLimitError, match="decision grid"):
            grid_index_at_or_after(t, 0.02, 0)


def test_request_batch_rejects_arrivals_past_the_limit():
    with pytest.raises(ArrivalLimitError, match=r"MAX_ARRIVAL_S=1e\+09"):
        RequestBatch.from_arrays([0.0, 2 * MAX_ARRIVAL_S], [10, 10], [10, 10])
    with pytest.raises(ArrivalLimitError, match="NaN"):
        RequestBatch.from_arrays([0.0, np.nan], [10, 10], [10, 10])
    RequestBatch.from_arrays([0.0, MAX_ARRIVAL_S], [10, 10], [10, 10])   # the limit itself is fine


def test_tiny_poisson_rate_names_the_option_and_the_limit():
    with pytest.raises(ArrivalLimitError, match=r"rate_rps=1e-09.*MAX_ARRIVAL_S"):
        PoissonArrivals(1e-9).times_s(np.random.default_rng(0), 2000)
    with pytest.raises(ArrivalLimitError, match="rate_rps"):
        DeterministicArrivals(1e-9).times_s(np.random.default_rng(0), 3)
    env = LLMClusterEnv(arrival_rate_rps=1e-9, num_requests=50)
    with pytest.raises(ArrivalLimitError, match="arrival_rate_rps"):
        env.reset(seed=0)


def test_trace_row_decades_later_is_a_format_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 5}\n'
                    '{"timestamp": 1000, "input_length": 5, "output_length": 5}\n'
                    '{"timestamp": 3e12, "input_length": 5, "output_length": 5}\n')
    with pytest.raises(TraceFormatError, match=r"line 3, column 'timestamp'.*MAX_ARRIVAL_S") as e:
        read_trace(path, "mooncake")
    assert e.value.path == str(path) and e.value.line == 3
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,374,44\n"
                     "2099-11-16 18:15:46.6805900,374,44\n")
    with pytest.raises(TraceFormatError, match=r"line 3, column 'TIMESTAMP'"):
        read_trace(azure, "azure")


def test_tiny_rate_scale_names_the_file_and_the_limit(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"timestamp": {i * 1000}, "input_length": 5, "output_length": 5}}\n'
                            for i in range(5)))
    w = TraceWorkload(path=str(path), format="mooncake", rate_scale=2e-9, start="head")
    with pytest.raises(ArrivalLimitError, match=rf"{path.name}.*rate_scale=2e-09.*MAX_ARRIVAL_S"):
        w.sample(np.random.default_rng(0), 5)
    with pytest.raises(ArrivalLimitError, match="rate_scale"):
        trace_window(np.random.default_rng(0), np.array([0.0, 10.0]), 2, "head", 1e-9)
