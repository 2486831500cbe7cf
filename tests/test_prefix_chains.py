"""Prefix hash chains the engine accepts keep the KV accounting exact; the rest are rejected.

A chain id names a prompt's whole prefix up to its block, so one id twice in one chain is corrupt
data; the engine counts a cached id's blocks once, so such a chain would let one request hold
many blocks of prompt in the memory of one (issue 22, class 1). Repeats are rejected where
chains enter (trace reader with file and line, ``RequestBatch``, ``RequestTable``), and
``check_invariants`` notices one that slips in later. Every other chain (ids shared between
requests in any order or position, chains shorter or longer than the prompt) is checked here
against an accounting of physical blocks written independently of the engine's counters.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_lb_gym.data.traces import TraceFormatError, read_trace
from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.latency import LatencyModel
from llm_lb_gym.sim.reference import RefRequest, simulate_reference
from llm_lb_gym.sim.request import RequestTable, Status
from llm_lb_gym.sim.simulate import simulate
from llm_lb_gym.workload.batch import RequestBatch

LAT = LatencyModel(base_s=0.01, token_s=5e-5, compute_token_s=2e-4, knee_tokens=48,
                   prefill_attn_s=1e-8, decode_seq_s=1e-4, decode_ctx_s=5e-7, cpu_base_s=1e-3,
                   cpu_seq_s=2e-5)
EXAMPLES = int(os.environ.get("LLM_LB_GYM_HYPOTHESIS_EXAMPLES", "60"))


def _physical_blocks(e) -> int:
    """Blocks the instance's requests occupy, from the requests alone: each live request its own
    KV (vLLM: prompt + generated tokens except the newest, whole blocks) less the hash blocks it
    shares, plus one copy of every cached unit that some live request references. Asserts that
    a request's referenced ids are its chain's head and distinct (two positions of one prompt
    are two different blocks of memory)."""
    tb, bs, hb = e.table, e.kv.bs, e.kv.hb
    own = 0
    units: set = set()
    for r in list(e.running) + list(e.prefilling):
        n = tb.kv_refs[r]
        ids = tuple(tb.hashes[r][:n]) if n else ()
        assert len(set(ids)) == n, f"request {r} references one hash block twice: {ids}"
        if r in e.running:
            o = tb.o_base[r] + e.G - tb.g_base[r]
            own += -(-(tb.prompt[r] + o - 1) // bs)
        else:
            own += -(-(tb.prompt[r] + tb.o_base[r]) // bs)
        own -= hb * n
        units.update(ids)
    assert not units & set(e.kv.evictable), "an evictable block is referenced"
    return own + hb * len(units)


def _check_accounting(cluster) -> None:
    for e in cluster.engines:
        free = e.free_blocks   # brings the lazily counted decode growth up to date
        kv = e.kv
        assert kv.used == _physical_blocks(e), (kv.used, _physical_blocks(e))
        assert kv.ev_blocks == kv.hb * len(kv.evictable)
        assert 0 <= free and kv.used + kv.ev_blocks <= kv.total_blocks


def _drive(table, cfg, instances, fast=True, dt=0.05):
    """Route each arrival round robin, checking the independent accounting at every arrival
    and every ``dt`` of simulated time until the cluster drains."""
    cluster = Cluster(ClusterConfig(num_instances=instances, engine=cfg, fast=fast), table,
                      check=True)
    k = 0
    for t in sorted(set(table.arrival_s)):
        cluster.advance_to(t)
        _check_accounting(cluster)
        while cluster.queue:
            cluster.route(k % instances)
            k += 1
    t = cluster.t
    for _ in range(100_000):
        if cluster.done:
            break
        t += dt
        cluster.advance_to(t)
        _check_accounting(cluster)
    assert cluster.done
    return cluster


@st.composite
def chained_workloads(draw):
    """Up to 14 requests whose chains draw distinct ids from a small alphabet: ids recur across
    requests at other positions, in other orders, chains cover part of a prompt or more."""
    n = draw(st.integers(1, 14))
    H = 4 * draw(st.sampled_from([1, 2]))
    alphabet = draw(st.integers(2, 12))
    arr = np.cumsum(draw(st.lists(st.floats(0.0, 0.3), min_size=n, max_size=n)))
    p = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    d = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    chains = [tuple(draw(st.lists(st.integers(0, alphabet), unique=True, max_size=12)))
              for _ in range(n)]
    return arr, p, d, chains, H


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=chained_workloads(), blocks=st.integers(14, 40), max_seqs=st.integers(1, 6),
       chunked=st.booleans(), fast=st.booleans(), instances=st.integers(1, 2))
def test_random_chains_keep_kv_accounting_exact(w, blocks, max_seqs, chunked, fast, instances):
    arr, p, d, chains, H = w
    cfg = EngineConfig(block_size=4, num_kv_blocks=blocks, max_num_seqs=max_seqs,
                       max_num_batched_tokens=max(16, max_seqs) if chunked else 80,
                       max_model_len=80, chunked_prefill=chunked, latency=LAT,
                       enable_prefix_caching=True)
    table = RequestTable(arr, p, d, d, prefix_hashes=chains, hash_block_tokens=H)
    cluster = _drive(table, cfg, instances, fast)
    assert all(s in (Status.FINISHED, Status.REJECTED) for s in table.status)
    for e in cluster.engines:
        assert e.kv.used == 0 and all(c == 0 for c in e.kv.kv_ref.values())
    if instances == 1:   # one instance: the reference simulator times every request the same
        ok = [i for i in range(len(arr)) if table.status[i] == Status.FINISHED]
        reqs = [RefRequest(i, float(arr[i]), p[i], d[i], float(d[i]), chains[i]) for i in ok]
        ref, _ = simulate_reference(reqs, cfg, check=True, hash_block_tokens=H)
        for i, r in zip(ok, ref):
            assert table.finish_s[i] == pytest.approx(r.finish_s, rel=1e-9, abs=1e-9), i


def test_check_invariants_notices_a_repeated_chain_that_slips_in():
    """Ten requests of 8 blocks whose chains all read (1, 1, ..., 1) once the table is built: the
    engine would count each as one block and run them together in a 20-block cache that fits
    two. The invariant check stops it at the first state change."""
    cfg = EngineConfig(block_size=4, num_kv_blocks=20, max_num_seqs=16, max_model_len=64,
                       max_num_batched_tokens=512, latency=LAT, enable_prefix_caching=True)
    n = 10
    table = RequestTable([0.001 * i for i in range(n)], [33] * n, [20] * n, [20] * n,
                         prefix_hashes=[tuple(range(100 * i, 100 * i + 8)) for i in range(n)],
                         hash_block_tokens=4)
    table.hashes = [(1,) * 8] * n   # bypass construction-time validation
    batch = RequestBatch.from_arrays(table.arrival_s, [33] * n, [20] * n)
    with pytest.raises(AssertionError, match="hash twice"):
        simulate(batch, ClusterConfig(num_instances=1, engine=cfg), table=table, check=True)


@pytest.mark.parametrize("chain", [(1, 1), (5, 6, 7, 6), (0, 2, 0, 3)])
def test_repeated_chain_rejected_by_table_and_batch(chain):
    with pytest.raises(ValueError, match=r"RequestTable.prefix_hashes\[1\] repeats hash id"):
        RequestTable([0.0, 1.0], [64, 64], [1, 1], [1, 1], prefix_hashes=[(9,), chain],
                     hash_block_tokens=16)
    with pytest.raises(ValueError, match=r"RequestBatch.prefix_hashes\[1\] repeats hash id"):
        RequestBatch.from_arrays([0.0, 1.0], [64, 64], [1, 1], prefix_hashes=[(9,), chain],
                                 hash_block_tokens=16)


def test_unhashable_or_scalar_chain_is_a_named_error():
    with pytest.raises(ValueError, match=r"prefix_hashes\[0\].*hashable ids"):
        RequestBatch.from_arrays([0.0], [64], [1], prefix_hashes=[([1], 2)], hash_block_tokens=16)
    with pytest.raises(ValueError, match=r"prefix_hashes\[0\].*hashable ids"):
        RequestTable([0.0], [64], [1], [1], prefix_hashes=[5], hash_block_tokens=16)


def test_reader_rejects_a_repeated_chain_with_file_and_line(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [0, 1, 2]},
            {"timestamp": 5, "input_length": 1500, "output_length": 10, "hash_ids": [3, 4, 3]}]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TraceFormatError, match=r"t.jsonl, line 2, column 'hash_ids': hash id 3 "
                                               r"repeats at position 2 \(first at 0\)") as e:
        read_trace(path, "mooncake")
    assert (e.value.line, e.value.column) == (2, "hash_ids")
