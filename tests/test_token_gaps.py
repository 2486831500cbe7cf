"""Inter-token gaps (ITL) from the engine's decode iterations (``Engine.record_token_gaps``,
``calibration/replay.token_gaps``): what a streaming client's ITL percentiles are computed from.

Checked three ways: a lone request's gaps are its decode steps, worked out from the latency
model; the fast engine (decode stretches in closed form, cut anywhere by the clock) logs the same
multiset of gaps as the step-by-step mode; and every decode token is counted once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_lb_gym.calibration.replay import token_gaps, weighted_quantile
from llm_lb_gym.sim.clock import run_on_arrival
from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.latency import LatencyModel
from llm_lb_gym.sim.request import RequestTable

LAT = LatencyModel(base_s=0.01, token_s=2e-5, prefill_attn_s=1e-7, decode_seq_s=1e-4, decode_ctx_s=2e-6)


def _run(cfg: EngineConfig, arr, p, d, fast: bool = True, step_s: float | None = None):
    table = RequestTable(np.asarray(arr, float), p, d, d)
    cluster = Cluster(ClusterConfig(num_instances=1, engine=cfg, fast=fast), table)
    cluster.engines[0].record_token_gaps()

    def route_all(c):
        while c.queue:
            c.route(0)

    if step_s is None:
        run_on_arrival(cluster, route_all)
    else:   # the clock cut at every step_s (as the env's decision grid cuts decode stretches)
        T = 0.0
        while not cluster.done:
            T += step_s
            cluster.advance_to(T)
            route_all(cluster)
    return table, cluster


def test_a_lone_requests_gaps_are_its_decode_steps():
    cfg = EngineConfig(latency=LAT, max_num_seqs=8, num_kv_blocks=100, watermark=0.0)
    table, cluster = _run(cfg, [0.0], [32], [5])
    gaps, w = token_gaps(cluster.engines[0].gap_log)
    want = sorted(LAT.iteration_s(decode_seqs=1, decode_ctx_tokens=32 + o) for o in range(1, 5))
    assert list(w) == [1, 1, 1, 1]
    assert gaps == pytest.approx(want, rel=1e-12)
    assert table.finish_s[0] - table.first_token_s[0] == pytest.approx(sum(want), rel=1e-12)
    assert weighted_quantile(gaps, w, 0.5) == pytest.approx(want[1], rel=1e-12)   # 2 of 4 at or below


def test_a_prefill_between_decodes_is_in_the_gap_of_the_requests_it_stalls():
    # Without chunked prefill B's prefill stops A's decoding: A's gap across it is the prefill
    # plus the decode step after it; B's first gap is that decode step alone.
    cfg = EngineConfig(latency=LAT, max_num_seqs=8, num_kv_blocks=100, watermark=0.0)
    table, cluster = _run(cfg, [0.0, 0.015], [16, 16], [3, 2])
    gaps, w = token_gaps(cluster.engines[0].gap_log)
    assert int(w.sum()) == (3 - 1) + (2 - 1)
    prefill_b = LAT.iteration_s(prefill_tokens=16, prefill_attn_pairs=16 * 17 // 2, prefill_seqs=1)
    assert gaps.max() > prefill_b   # A's gap spans B's prefill


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), chunked=st.booleans(), chunk_alloc=st.booleans(),
       step_s=st.sampled_from([None, 0.003, 0.02]))
def test_fast_engine_logs_the_step_modes_gaps(seed, chunked, chunk_alloc, step_s):
    rng = np.random.default_rng(seed)
    n = 20
    arr = np.cumsum(rng.exponential(0.01, n))
    p, d = rng.integers(1, 60, n), rng.integers(1, 60, n)
    cfg = EngineConfig(latency=LAT, block_size=4, num_kv_blocks=2000, max_num_seqs=6, max_model_len=120,
                       max_num_batched_tokens=32 if chunked else 120, chunked_prefill=chunked,
                       kv_allocation="chunk" if chunked and chunk_alloc else "request")
    _, fast = _run(cfg, arr, p, d, fast=True, step_s=step_s)
    _, step = _run(cfg, arr, p, d, fast=False, step_s=step_s)
    g1, w1 = token_gaps(fast.engines[0].gap_log)
    g2, w2 = token_gaps(step.engines[0].gap_log)
    assert int(w1.sum()) == int(w2.sum()) == int(np.sum(d - 1))   # ample KV: no preemption
    assert np.repeat(g1, w1) == pytest.approx(np.repeat(g2, w2), rel=1e-9, abs=1e-12)


def test_gaps_are_off_unless_asked():
    cfg = EngineConfig(latency=LAT)
    table = RequestTable(np.zeros(1), [8], [3], [3])
    assert Cluster(ClusterConfig(num_instances=1, engine=cfg), table).engines[0].gap_log is None
