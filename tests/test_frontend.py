"""The server's frontend (sim/frontend.py): worked cases, and that it shows in TTFT, in short-request
throughput and in the env's dynamics. (Engine == reference with a frontend, and compiled == pure:
tests/test_engine_vs_reference.py, tests/test_compiled_engine.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.frontend import FrontendModel
from llm_lb_gym.sim.latency import LatencyModel
from llm_lb_gym.sim.metrics import episode_metrics
from llm_lb_gym.sim.request import RequestTable
from llm_lb_gym.sim.simulate import simulate
from llm_lb_gym.workload.batch import RequestBatch

LAT = LatencyModel(base_s=0.01, token_s=1e-4)
FE = FrontendModel(delay_s=0.02, request_s=0.004, prompt_token_s=1e-5, first_token_s=0.001, output_token_s=2e-4)


def _run(arr, p, d, frontend, lat=LAT):
    cfg = EngineConfig(latency=lat, cpu_overhead=False, frontend=frontend, max_num_seqs=256)
    table = RequestTable(arr, p, d, d)
    simulate(RequestBatch.from_arrays(arr, p, d), ClusterConfig(num_instances=1, engine=cfg), table=table)
    return table


def test_a_lone_request_by_hand():
    t = _run([0.0], [100], [5], FE)
    start = 0.02 + 0.004 + 100 * 1e-5                     # delay, then the input job alone on the CPU
    prefill = 0.01 + 100 * 1e-4
    assert t.first_scheduled_s[0] == pytest.approx(start, rel=1e-12)
    assert t.first_token_s[0] == pytest.approx(start + prefill, rel=1e-12)
    # The first chunk (1 ms) runs during the first decode iteration (10.1 ms), whose token's
    # output work (0.2 ms, output_stream.py) takes 0.2 / 10.1 of the CPU over it.
    step = 0.01 + 1e-4
    assert t.seen_first_token_s[0] == pytest.approx(t.first_token_s[0] + 0.001 / (1 - 2e-4 / step), rel=1e-9)
    decode_end = t.first_token_s[0] + 4 * step
    assert t.finish_s[0] == pytest.approx(decode_end, rel=1e-12)
    assert t.seen_finish_s[0] == pytest.approx(decode_end, rel=1e-12)   # the CPU kept up: the engine ends last
    m = episode_metrics(t)
    assert m["mean_ttft_s"] == pytest.approx(t.seen_first_token_s[0], rel=1e-12)


def test_short_request_flood_is_bound_by_the_frontend():
    n = 400
    arr, p, d = np.zeros(n), np.full(n, 128), np.full(n, 4)
    fast_gpu = LatencyModel(base_s=1e-3, token_s=1e-7)   # the forward passes take next to nothing
    without, with_fe = _run(arr, p, d, None, fast_gpu), _run(arr, p, d, FE, fast_gpu)
    cpu_per_request = FE.request_s + 128 * FE.prompt_token_s + FE.first_token_s + 3 * FE.output_token_s
    m0, m1 = episode_metrics(without), episode_metrics(with_fe)
    assert m1["makespan_s"] == pytest.approx(FE.delay_s + n * cpu_per_request, rel=0.02)   # the CPU's work
    assert m1["makespan_s"] > 5 * m0["makespan_s"] and m1["mean_ttft_s"] > 5 * m0["mean_ttft_s"]


def test_frontend_shows_in_the_env():
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401  (registers the env)

    fe = {"delay_s": 0.05, "request_s": 0.01, "prompt_token_s": 0.0, "first_token_s": 0.0, "output_token_s": 0.0}
    out = []
    for engine in ({}, {"frontend": fe}):
        env = gym.make("LLMCluster-v0", num_requests=120, engine=engine)
        env.reset(seed=3)
        done, info = False, {}
        while not done:
            mask = env.unwrapped.action_masks()
            _, _, term, trunc, info = env.step(int(np.flatnonzero(mask)[0]))
            done = term or trunc
        out.append(info["metrics"])
    assert out[1]["completed"] == out[0]["completed"] == 120
    assert out[1]["mean_ttft_s"] >= out[0]["mean_ttft_s"] + 0.06 - 1e-9   # every request pays delay + its input job


def test_one_input_worker_prepares_simultaneous_requests_one_after_another():
    """Three requests at once: shared equally (input_workers=0) every input ends at 3 x its work;
    one at a time (1) they end at 1x, 2x and 3x, in arrival order, and the total CPU is the same."""
    fe = FrontendModel(request_s=0.01)
    fast = LatencyModel(base_s=1e-3, token_s=1e-7)
    arr, p, d = np.zeros(3), np.full(3, 16), np.full(3, 2)
    shared = _run(arr, p, d, fe, fast)
    one = _run(arr, p, d, FrontendModel(request_s=0.01, input_workers=1), fast)
    # Shared: every input completes at 30 ms, so the three reach the engine together.
    assert np.allclose(shared.first_scheduled_s, 0.03, rtol=1e-12)
    # One at a time: ready at 10, 20, 30 ms; each is scheduled at the first iteration start after.
    ready = np.array([0.01, 0.02, 0.03])
    assert np.all(one.first_scheduled_s >= ready - 1e-12)
    assert one.first_scheduled_s[0] == pytest.approx(0.01, rel=1e-12)
    assert np.all(np.diff(one.first_scheduled_s) > 0)
    assert episode_metrics(one)["mean_ttft_s"] < episode_metrics(shared)["mean_ttft_s"]
    assert np.nanmax(one.seen_first_token_s) == pytest.approx(np.nanmax(shared.seen_first_token_s), abs=3e-3)


def test_input_workers_is_validated_and_zero_is_the_old_model():
    from llm_lb_gym._validate import ConfigError
    from llm_lb_gym.sim.frontend import resolve_frontend

    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="input_workers"):
            FrontendModel(input_workers=bad)
    with pytest.raises(ConfigError, match="input_workers"):
        resolve_frontend({"input_workers": -2})
    n = 50
    rng = np.random.default_rng(0)
    arr, p, d = np.sort(rng.uniform(0, 1, n)), rng.integers(10, 200, n), rng.integers(1, 30, n)
    a, b = _run(arr, p, d, FE), _run(arr, p, d, FrontendModel(**{**FE.__dict__, "input_workers": 0}))
    assert np.array_equal(a.seen_first_token_s, b.seen_first_token_s) and np.array_equal(a.seen_finish_s, b.seen_finish_s)
    # A worker limit above the number of requests in flight changes nothing either.
    c = _run(arr, p, d, FrontendModel(**{**FE.__dict__, "input_workers": n}))
    assert np.array_equal(a.seen_first_token_s, c.seen_first_token_s)


@pytest.mark.parametrize("fast", [True, False])
def test_a_server_woken_from_idleness_answers_later_by_hand(fast):
    """``wake_s``: a request reaching an idle server waits the extra delay of its idle time
    (linear between the points, flat beyond); one that finds the server busy waits none."""
    from llm_lb_gym.sim.cluster import Cluster

    wake = ((0.1, 0.002), (1.0, 0.011), (5.0, 0.03))
    fe = FrontendModel(delay_s=0.02, wake_s=wake)
    assert [fe.wake_delay_s(x) for x in (0.0, 0.1, 0.55, 1.0, 3.0, 9.0)] == pytest.approx(
        [0.002, 0.002, 0.0065, 0.011, 0.0205, 0.03])

    def run(arr, frontend):
        cfg = EngineConfig(latency=LAT, cpu_overhead=False, frontend=frontend, max_num_seqs=256)
        table = RequestTable(arr, [100] * len(arr), [5] * len(arr), [5] * len(arr))
        cluster = Cluster(ClusterConfig(num_instances=1, engine=cfg, fast=fast), table)
        for k in range(table.n):
            cluster.advance_to(arr[k])
            cluster.route(0)
        cluster.run_to_completion()
        return table

    # request 0 at t=0 (idle since 0: 2 ms), 1 while 0 runs (none), 2 after 3 s idle (20.5 ms)
    arr = [0.0, 0.03, 0.0]
    plain = run([0.0, 0.03], FrontendModel(delay_s=0.02))
    arr[2] = plain.finish_s[1] + 3.0
    t, base = run(arr, fe), run(arr, FrontendModel(delay_s=0.02))
    assert t.first_scheduled_s[0] == pytest.approx(base.first_scheduled_s[0] + 0.002, rel=1e-12)
    idle = arr[2] - max(t.finish_s[:2])    # ~3 s (request 0's wake moved the first two ends)
    assert t.first_scheduled_s[2] == pytest.approx(base.first_scheduled_s[2] + fe.wake_delay_s(idle), rel=1e-12)
    assert fe.wake_delay_s(idle) == pytest.approx(0.0205, rel=1e-3)
    assert t.finish_s[1] - t.first_scheduled_s[0] == pytest.approx(base.finish_s[1] - base.first_scheduled_s[0], rel=1e-9)
    assert run(arr, FrontendModel(delay_s=0.02, wake_s=())).finish_s == base.finish_s


def test_wake_points_are_validated():
    from llm_lb_gym.sim.frontend import resolve_frontend

    for bad in (((1.0, 0.01), (0.5, 0.02)), ((0.0, -1e-3),), (("a", 1),), 5):
        with pytest.raises(ConfigError, match="wake_s"):
            FrontendModel(wake_s=bad)
    assert resolve_frontend({"wake_s": [[0, 0.001], [2, 0.01]]}).wake_s == ((0.0, 0.001), (2.0, 0.01))


def _frontend_cluster():
    from llm_lb_gym.sim.cluster import Cluster

    rng = np.random.default_rng(1)
    n = 200
    arr = np.cumsum(rng.exponential(0.02, n))
    p, d = rng.integers(20, 400, n), rng.integers(20, 300, n)
    fe = FrontendModel(delay_s=3e-3, request_s=2e-3, prompt_token_s=1e-6, first_token_s=5e-4, output_token_s=2e-4,
                       input_workers=1)
    cfg = EngineConfig(latency=LAT, frontend=fe, max_num_seqs=64, chunked_prefill=True, max_num_batched_tokens=512)
    return Cluster(ClusterConfig(num_instances=2, engine=cfg), RequestTable(arr, p, d, d))


def _to_end(c):
    from llm_lb_gym.sim.clock import run_on_arrival

    def route_all(cl):
        while cl.queue:
            cl.route(cl.queue[0] % 2)

    run_on_arrival(c, route_all)
    m = episode_metrics(c.table)   # flushes the table's frontends
    return np.array(c.table.seen_first_token_s), np.array(c.table.seen_finish_s), m["mean_ttft_s"]


@pytest.mark.parametrize("how", ["deepcopy", "copy_cluster"])
def test_a_copied_cluster_with_a_frontend_runs_on_alone(how):
    """A copy made mid-run (``copy.deepcopy``: the env wrappers'; ``copy_cluster``: the
    lookahead routers') and the original, each run to the end, give the uninterrupted run's
    client-side times: the copy's frontend asks its own engine for the decode iterations it ran
    (``Engine._fe_flush``; a bound method of the compiled engine would have been shared by
    ``deepcopy``), and the copy's table lists its own frontends (flushing the copy's must not
    run the original's to the end)."""
    import copy

    from llm_lb_gym.routers.improve import copy_cluster

    want = _to_end(_frontend_cluster())
    c = _frontend_cluster()
    while c.next_arrival_s <= 1.5:
        c.advance_to(c.next_arrival_s)
        while c.queue:
            c.route(c.queue[0] % 2)
    dup = copy.deepcopy(c) if how == "deepcopy" else copy_cluster(c)
    for got in (_to_end(dup), _to_end(c)):
        for g, w in zip(got[:2], want[:2]):
            assert np.array_equal(g, w, equal_nan=True)
        assert got[2] == want[2]
