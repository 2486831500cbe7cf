"""Property tests of the whole cluster under random workloads and every router.

For any workload, engine configuration and router: every request ends finished or rejected with
a reason; lifecycle timestamps are ordered; KV blocks stay within [0, capacity] (the engines'
from-scratch invariant checks run after every iteration); the cluster clock never goes back;
and the same inputs give the same results bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_lb_gym.routers.drive import run_router
from llm_lb_gym.routers.registry import ROUTERS, make_router
from llm_lb_gym.predictor.buckets import BucketScheme
from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.latency import LatencyModel
from llm_lb_gym.sim.request import REJECT_REASONS, Status
from llm_lb_gym.workload.batch import RequestBatch

LAT = LatencyModel(base_s=0.01, token_s=2e-4, prefill_attn_s=1e-8, decode_seq_s=1e-4,
                   decode_ctx_s=5e-7)
SCHEME = BucketScheme((32, 128))


def _episode(seed, router_name, scheduler, chunked, blocks, instances, fast=True):
    rng = np.random.default_rng(seed)
    n = 40
    arr = np.cumsum(rng.exponential(1 / 30.0, n))
    p = rng.integers(1, 200, n)
    d = rng.integers(1, 200, n)
    pred = np.maximum(1.0, d * rng.uniform(0.3, 2.0, n))
    batch = RequestBatch.from_arrays(arr, p, d)
    cfg = EngineConfig(block_size=8, num_kv_blocks=blocks, max_num_seqs=6, max_model_len=300,
                       max_num_batched_tokens=64 if chunked else 300, chunked_prefill=chunked,
                       scheduler=scheduler, latency=LAT)
    opts = {"decode_edges_tokens": SCHEME.edges_tokens} if router_name == "min_min" else {}
    times = []
    orig = Cluster.advance_to

    def spy(self, T):
        times.append(T)
        return orig(self, T)

    Cluster.advance_to = spy
    try:
        cluster = run_router(batch, ClusterConfig(num_instances=instances, engine=cfg, fast=fast),
                             make_router(router_name, **opts), np.random.default_rng(seed + 1), 0.02,
                             pred, decode_scheme=SCHEME, check=True)
    finally:
        Cluster.advance_to = orig
    return cluster, times


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The lookahead router advances copies of the cluster (the clock spy would see their clocks);
# tests/test_lookahead.py runs it to completion with the invariant checks on.
@given(seed=st.integers(0, 10_000), router=st.sampled_from(sorted(set(ROUTERS) - {"lookahead"})),
       scheduler=st.sampled_from(["fcfs", "least_work_left", "bin_packing"]), chunked=st.booleans(),
       blocks=st.integers(20, 120), instances=st.integers(1, 4))
def test_cluster_invariants(seed, router, scheduler, chunked, blocks, instances):
    cluster, times = _episode(seed, router, scheduler, chunked, blocks, instances)
    tb = cluster.table
    assert cluster.done
    assert all(b >= a for a, b in zip(times, times[1:])), "clock went backwards"
    for i in range(tb.n):
        if tb.status[i] == Status.REJECTED:
            assert tb.reject_reason[i] in REJECT_REASONS
            continue
        assert tb.status[i] == Status.FINISHED and tb.reject_reason[i] is None
        arrival, routed = tb.arrival_s[i], tb.routed_s[i]
        sched, first, fin = tb.first_scheduled_s[i], tb.first_token_s[i], tb.finish_s[i]
        assert arrival <= routed <= sched < first <= fin, (i, arrival, routed, sched, first, fin)
        assert 0 <= tb.instance[i] < instances
    for e in cluster.engines:
        e._sync_used()
        assert e.used == 0 and e.idle() and 0 <= e.peak_used <= e.total_blocks
    assert cluster.n_finished + cluster.n_rejected == tb.n


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), router=st.sampled_from(["random", "power_of_two", "jsq"]))
def test_same_seed_same_results(seed, router):
    a, _ = _episode(seed, router, "fcfs", False, 60, 3)
    b, _ = _episode(seed, router, "fcfs", False, 60, 3)
    for name in ("finish_s", "first_token_s", "instance", "preemptions"):
        assert getattr(a.table, name) == getattr(b.table, name) or all(
            (x == y) or (math.isnan(x) and math.isnan(y)) for x, y in zip(getattr(a.table, name), getattr(b.table, name)))
