"""The fast engine against the naive step-by-step reference, on random workloads.

The fast engine advances decode stretches in closed form and keeps aggregates; the reference
(``llm_lb_gym/sim/reference.py``) simulates one iteration at a time with per-request objects.
Same contract (docs/simulator_semantics.md), independent code: the per-request timestamps must
agree to floating-point tolerance, and the engine's own invariants hold after every iteration.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.latency import LatencyModel
from llm_lb_gym.sim.reference import RefRequest, simulate_reference
from llm_lb_gym.sim.request import RequestTable, Status
from llm_lb_gym.sim.simulate import simulate
from llm_lb_gym.workload.batch import RequestBatch

# Every term of the model, with a knee low enough that prompts and large decode batches cross it,
# GEMM tiles of 8 tokens, a small-batch decode price for batches of 1-3 (max_seqs goes to 8) and
# token segments that decode batches and prompts cross (a free one among them).
LAT = LatencyModel(base_s=0.01, token_s=2e-5, token_segments=((2, 5e-5), (6, 0.0), (40, 1e-4)),
                   compute_token_s=2e-4, knee_tokens=24.5, tile_tokens=8,
                   prefill_attn_s=1e-8, decode_seq_s=1e-4, decode_ctx_s=5e-7, decode_ctx_small_s=2e-7,
                   small_batch_seqs=3, cpu_base_s=1e-3, cpu_seq_s=3e-5)


def _workload(seed: int, n: int, rate: float, max_p: int, max_d: int):
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1.0 / rate, n))
    p = rng.integers(1, max_p + 1, n)
    d = rng.integers(1, max_d + 1, n)
    pred = np.maximum(1.0, d * rng.uniform(0.5, 1.5, n))
    return arr, p, d, pred


def _run_both(cfg: EngineConfig, arr, p, d, pred, fast=True):
    table = RequestTable(arr, p, d, pred)
    batch = RequestBatch.from_arrays(arr, p, d)
    cluster = simulate(batch, ClusterConfig(num_instances=1, engine=cfg, fast=fast), table=table,
                       check=True)
    ok = [i for i in range(len(arr)) if table.status[i] == Status.FINISHED]
    reqs = [RefRequest(i, float(arr[i]), int(p[i]), int(d[i]), float(pred[i])) for i in ok]
    ref, stats = simulate_reference(reqs, cfg, check=True)
    return table, ok, ref, stats, cluster


def _assert_same(table, ok, ref):
    for i, r in zip(ok, ref):
        assert r.rid == i
        for name in ("first_scheduled_s", "first_token_s", "finish_s"):
            got, want = getattr(table, name)[i], getattr(r, name)
            assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (name, i, got, want)
        assert table.preemptions[i] == r.preemptions, i


@settings(max_examples=int(__import__("os").environ.get("LLM_LB_GYM_HYPOTHESIS_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), scheduler=st.sampled_from(["fcfs", "least_work_left", "bin_packing"]),
       chunked=st.booleans(), chunk_alloc=st.booleans(), blocks=st.integers(12, 80), max_seqs=st.integers(1, 8),
       budget=st.integers(8, 64), fast=st.booleans(), async_scheduling=st.booleans())
def test_engine_matches_reference(seed, scheduler, chunked, chunk_alloc, blocks, max_seqs, budget, fast,
                                  async_scheduling):
    # Small KV caches and batch limits so preemption, watermark and budget paths all occur.
    max_len = 120
    cfg = EngineConfig(block_size=4, num_kv_blocks=blocks, max_num_seqs=max_seqs,
                       max_num_batched_tokens=max(budget, max_seqs) if chunked else max_len,
                       max_model_len=max_len, chunked_prefill=chunked, scheduler=scheduler,
                       kv_allocation="chunk" if chunked and chunk_alloc else "request",
                       latency=LAT, async_scheduling=async_scheduling)
    arr, p, d, pred = _workload(seed, 25, rate=20.0, max_p=60, max_d=60)
    table, ok, ref, stats, cluster = _run_both(cfg, arr, p, d, pred, fast)
    _assert_same(table, ok, ref)
    assert cluster.done
    assert sum(table.preemptions) == stats.preemptions


def test_fast_and_step_modes_agree_under_heavy_load():
    cfg = EngineConfig(num_kv_blocks=200, latency=LAT)
    arr, p, d, pred = _workload(3, 300, rate=40.0, max_p=400, max_d=500)
    tf, *_ = _run_both(cfg, arr, p, d, pred, fast=True)
    ts, ok, ref, stats, _ = _run_both(cfg, arr, p, d, pred, fast=False)
    assert stats.preemptions > 10   # the scenario really exercises preemption
    for name in ("first_token_s", "finish_s"):
        a, b = np.array(getattr(tf, name)), np.array(getattr(ts, name))
        np.testing.assert_allclose(a, b, rtol=1e-9)
    _assert_same(tf, ok, ref)


def test_rejections_are_counted_with_reasons():
    cfg = EngineConfig(num_kv_blocks=10, block_size=4, max_model_len=100, latency=LAT,
                       max_num_batched_tokens=100)
    arr = np.array([0.0, 0.1, 0.2, 0.3])
    p = np.array([10, 90, 30, 5])
    d = np.array([5, 20, 20, 5])   # 110 > max_model_len; 50 tokens > 9 usable blocks * 4
    table = RequestTable(arr, p, d, d)
    cluster = simulate(RequestBatch.from_arrays(arr, p, d), ClusterConfig(num_instances=2, engine=cfg),
                       table=table)
    assert table.reject_reason == [None, "exceeds_max_model_len", "exceeds_kv_capacity", None]
    assert cluster.n_rejected == 2 and cluster.n_finished == 2 and cluster.done


def test_clock_never_goes_backwards():
    cfg = EngineConfig(latency=LAT)
    table = RequestTable([0.0], [10], [5], [5])
    cluster = Cluster(ClusterConfig(num_instances=1, engine=cfg), table)
    cluster.advance_to(1.0)
    with pytest.raises(ValueError, match="backwards"):
        cluster.advance_to(0.5)


def test_one_request_alone_matches_isolated_latency():
    cfg = EngineConfig()   # the default V100 preset
    lat = cfg.latency_model
    table = RequestTable([0.0], [1000], [1000], [1000])
    simulate(RequestBatch.from_arrays([0.0], [1000], [1000]), ClusterConfig(num_instances=1, engine=cfg),
             table=table)
    assert table.finish_s[0] == pytest.approx(lat.isolated_request_s(1000, 1000), rel=1e-12)
    assert table.finish_s[0] == pytest.approx(17.0, rel=0.01)   # the paper's figure
    assert math.isclose(table.first_token_s[0], lat.prefill_s(1000), rel_tol=1e-12)


def test_paper_interference_scenario_on_the_v100_preset():
    """Paper §4.2: a p=d=1000 request alone takes 17 s; with a p=d=500 request arriving every
    50th iteration it takes 31 s. The V100 preset is fitted to both (experiments/paper_v100.py,
    which drives one engine directly, in the wall-clock reading); here the same scenario runs
    through the cluster and must give the same time."""
    from llm_lb_gym.calibration.paper_v100 import interference_s

    cfg = EngineConfig()
    lat = cfg.latency_model
    assert interference_s(lat, "wall_clock") == pytest.approx(31.0, rel=0.005)
    first = lat.prefill_s(1000)
    step = (lat.isolated_request_s(1000, 1000) - first) / 999
    arr = [0.0] + [first + 50 * k * step for k in range(1, 80)]
    p, d = [1000] + [500] * 79, [1000] + [500] * 79
    table = RequestTable(arr, p, d, d)
    simulate(RequestBatch.from_arrays(arr, p, d), ClusterConfig(num_instances=1, engine=cfg), table=table)
    assert table.finish_s[0] == pytest.approx(interference_s(lat, "wall_clock"), rel=1e-9)


def _assert_same_client_times(table, ok, ref):
    for i, r in zip(ok, ref):
        for name in ("seen_first_token_s", "seen_finish_s"):
            got, want = getattr(table, name)[i], getattr(r, name)
            assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (name, i, got, want)


@settings(max_examples=int(__import__("os").environ.get("LLM_LB_GYM_HYPOTHESIS_EXAMPLES", "30")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), chunked=st.booleans(), chunk_alloc=st.booleans(), blocks=st.integers(12, 80),
       max_seqs=st.integers(1, 8), fast=st.booleans(), rate=st.sampled_from([5.0, 20.0, 200.0]),
       scheduler=st.sampled_from(["fcfs", "least_work_left"]), input_workers=st.sampled_from([0, 0, 1, 2]),
       wake=st.booleans(), async_scheduling=st.booleans(), per_token=st.sampled_from([2e-4, 2e-4, 3e-3]))
def test_engine_with_frontend_matches_reference(seed, chunked, chunk_alloc, blocks, max_seqs, fast, rate, scheduler,
                                                input_workers, wake, async_scheduling, per_token):
    """The frontend (sim/frontend.py) in front of the engine: the engine with its virtual-time
    processor sharing against the reference's literal one, from light load (the frontend only
    delays) to a burst that queues in it (rate 200/s: its input work alone is ~2-8 ms), with
    every input at once or one or two at a time (``input_workers``), with or without the extra
    delay of a server woken from idleness (``wake_s``), scheduling synchronously or one step
    ahead (``async_scheduling``: what leaves the frontend waits one iteration more), with the
    streamed tokens' output work within the CPU or beyond it (``per_token`` 3 ms: 8 tokens of a
    ~10 ms iteration leave a backlog, output_stream.py)."""
    from llm_lb_gym.sim.frontend import FrontendModel

    max_len = 120
    fe = FrontendModel(delay_s=3e-3, request_s=2e-3, prompt_token_s=1e-4, first_token_s=5e-4, output_token_s=per_token,
                       input_workers=input_workers, wake_s=((0.01, 1e-3), (0.2, 8e-3), (1.0, 2e-2)) if wake else ())
    cfg = EngineConfig(block_size=4, num_kv_blocks=blocks, max_num_seqs=max_seqs,
                       max_num_batched_tokens=max(32, max_seqs) if chunked else max_len,
                       max_model_len=max_len, chunked_prefill=chunked, scheduler=scheduler,
                       kv_allocation="chunk" if chunked and chunk_alloc else "request",
                       latency=LAT, frontend=fe, async_scheduling=async_scheduling)
    arr, p, d, pred = _workload(seed, 25, rate=rate, max_p=60, max_d=60)
    table, ok, ref, stats, cluster = _run_both(cfg, arr, p, d, pred, fast)
    _assert_same(table, ok, ref)
    _assert_same_client_times(table, ok, ref)
    assert cluster.done
    for i in ok:   # the client sees each token after the engine made it
        assert table.seen_first_token_s[i] >= table.first_token_s[i]
        assert table.seen_finish_s[i] >= max(table.finish_s[i], table.seen_first_token_s[i])
        assert table.first_scheduled_s[i] >= arr[i] + fe.delay_s + fe.input_s(int(p[i])) - 1e-12


# A CPU step (4 ms + 0.3 ms per sequence) longer than the GPU side of small batches (2 ms + ...),
# which the context growth of a decode stretch overtakes (2e-5 s per context token): under async
# scheduling the iterations switch from the CPU floor to the GPU side inside a stretch.
LAT_CPU = LatencyModel(base_s=0.002, token_s=2e-5, compute_token_s=2e-4, knee_tokens=24.5,
                       prefill_attn_s=1e-8, decode_seq_s=1e-4, decode_ctx_s=2e-5, cpu_base_s=4e-3, cpu_seq_s=3e-4)


@settings(max_examples=int(__import__("os").environ.get("LLM_LB_GYM_HYPOTHESIS_EXAMPLES", "30")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), chunked=st.booleans(), chunk_alloc=st.booleans(), blocks=st.integers(12, 80),
       max_seqs=st.integers(1, 8), fast=st.booleans(), rate=st.sampled_from([5.0, 40.0]))
def test_async_scheduling_matches_reference(seed, chunked, chunk_alloc, blocks, max_seqs, fast, rate):
    """``engine.async_scheduling``: every iteration lasts max(GPU side, CPU step) and a request
    joins one iteration later when the instance is busy; the engine's decode stretches (split
    where the GPU side overtakes the CPU floor, cut one iteration after an arrival) against the
    reference's one iteration at a time."""
    max_len = 120
    cfg = EngineConfig(block_size=4, num_kv_blocks=blocks, max_num_seqs=max_seqs,
                       max_num_batched_tokens=max(32, max_seqs) if chunked else max_len,
                       max_model_len=max_len, chunked_prefill=chunked,
                       kv_allocation="chunk" if chunked and chunk_alloc else "request",
                       latency=LAT_CPU, async_scheduling=True)
    arr, p, d, pred = _workload(seed, 25, rate=rate, max_p=60, max_d=60)
    table, ok, ref, stats, cluster = _run_both(cfg, arr, p, d, pred, fast)
    _assert_same(table, ok, ref)
    assert cluster.done


def test_async_scheduling_overlaps_the_cpu_step():
    """One request alone: each decode step takes the longer of its GPU side and the CPU step,
    where synchronous scheduling takes their sum; its prompt's iteration likewise."""
    lat = LAT_CPU
    p, d = 20, 200
    times = {}
    for overlap in (False, True):
        cfg = EngineConfig(block_size=4, num_kv_blocks=200, max_model_len=400, latency=lat, async_scheduling=overlap)
        table = RequestTable([0.0], [p], [d], [d])
        simulate(RequestBatch.from_arrays([0.0], [p], [d]), ClusterConfig(num_instances=1, engine=cfg), table=table)
        times[overlap] = (table.first_token_s[0], table.finish_s[0])
    gpu_pre = lat.without_cpu().iteration_s(prefill_tokens=p, prefill_attn_pairs=p * (p + 1) // 2)
    cpu1 = lat.cpu_base_s + lat.cpu_seq_s
    assert times[False][0] == pytest.approx(gpu_pre + cpu1, rel=1e-12)
    assert times[True][0] == pytest.approx(max(gpu_pre, cpu1), rel=1e-12)
    want = times[True][0] + sum(max(lat.without_cpu().iteration_s(decode_seqs=1, decode_ctx_tokens=p + k), cpu1)
                                for k in range(1, d))
    assert times[True][1] == pytest.approx(want, rel=1e-9)
    # the stretch crosses from the CPU floor to the GPU side (the test's point)
    assert lat.without_cpu().iteration_s(decode_seqs=1, decode_ctx_tokens=p + 1) < cpu1 \
        < lat.without_cpu().iteration_s(decode_seqs=1, decode_ctx_tokens=p + d - 1)
    assert times[True][1] < times[False][1]


def test_async_scheduling_takes_a_new_request_one_iteration_later():
    """A request routed while another decodes: synchronous scheduling prefills it at the first
    iteration start after its route, async scheduling at the one after that (that iteration was
    scheduled before it came); on an idle instance both start it at once."""
    lat = LAT_CPU.without_cpu()   # no CPU step: only the visibility differs
    arr, p, d = [0.0, 0.0503], [20, 20], [200, 5]
    first = {}
    for overlap in (False, True):
        cfg = EngineConfig(block_size=4, num_kv_blocks=200, max_model_len=400, latency=lat, async_scheduling=overlap)
        table = RequestTable(arr, p, d, d)
        simulate(RequestBatch.from_arrays(arr, p, d), ClusterConfig(num_instances=1, engine=cfg), table=table)
        first[overlap] = (table.first_scheduled_s[0], table.first_scheduled_s[1])
    t, starts = lat.iteration_s(prefill_tokens=20, prefill_attn_pairs=210), []
    k = 1
    while len(starts) < 2:   # decode iteration starts of request 0 from its first token on
        if t >= arr[1]:
            starts.append(t)
        t += lat.iteration_s(decode_seqs=1, decode_ctx_tokens=20 + k)
        k += 1
    assert first[False] == (0.0, pytest.approx(starts[0], rel=1e-12))
    assert first[True] == (0.0, pytest.approx(starts[1], rel=1e-12))
