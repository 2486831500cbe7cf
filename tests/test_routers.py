"""The heuristic routers: hand-derived assignment sequences, tie-breaks, registry, episodes.

Golden scenarios use a latency model with exact binary fractions so every time below is exact:
prefill of P tokens lasts 1 + P/8 s, a decode iteration of B sequences 1 + B/4 s. Block size 4,
no watermark. Predictions equal the true lengths (oracle) unless a test says otherwise, so
"left" below is true decode tokens still to generate.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.routers.mixing import MixingParams, mixing_scores
from llm_lb_gym.routers import ROUTERS, QueueRouter, Router, make_router, router_options, run_router
from llm_lb_gym.routers.drive import build_table, decide
from llm_lb_gym.predictor.buckets import BucketScheme
from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.latency import LatencyModel
from llm_lb_gym.sim.request import Status
from llm_lb_gym.workload.batch import poisson_batch
from llm_lb_gym.workload.batch import RequestBatch

# Decode of B sequences: 1 + B/8 (one batched token each) + B/8 (per decode sequence) = 1 + B/4.
SIMPLE = LatencyModel(base_s=1.0, token_s=0.125, prefill_attn_s=0.0,
                      decode_seq_s=0.125, decode_ctx_s=0.0)


def cfg(m: int, num_kv_blocks: int = 1000, **engine) -> ClusterConfig:
    return ClusterConfig(m, EngineConfig(block_size=4, num_kv_blocks=num_kv_blocks, watermark=0.0,
                                         latency=SIMPLE, **engine))


def batch(rows) -> RequestBatch:
    """rows of (arrival_s, prompt_tokens, decode_tokens)."""
    a, p, d = zip(*rows)
    return RequestBatch.from_arrays(a, p, d)


def instances(name: str, rows, m: int, seed: int = 0, interval: float = 0.0, **opts) -> list[int]:
    c = run_router(batch(rows), cfg(m), make_router(name, **opts), np.random.default_rng(seed), interval)
    return list(c.table.instance)


def loaded_cluster(m: int, rows, routes, num_kv_blocks: int = 1000) -> Cluster:
    """A cluster at t=0 with every request of ``rows`` (all arriving at 0) queued, and the first
    ``len(routes)`` of them routed to the given instances."""
    b = batch(rows)
    c = Cluster(cfg(m, num_kv_blocks), build_table(b))
    c.advance_to(0.0)
    for i in routes:
        c.route(i)
    return c


# A timed arrival list on two instances (p, d = prompt, decode tokens).
TIMED = [(0.0, 8, 4), (3.0, 4, 4), (3.1, 2, 1), (4.6, 4, 2), (4.6, 4, 2)]


def test_round_robin_sequence():
    # Round robin ignores state: instances in turn, 0 1 2 0 1 on three instances, 0 1 0 1 0 on two.
    assert instances("round_robin", TIMED, 3) == [0, 1, 2, 0, 1]
    assert instances("round_robin", TIMED, 2) == [0, 1, 0, 1, 0]


def test_jsq_sequence():
    # JSQ load = prompt tokens still to prefill + decode tokens still to generate.
    # t=0.0  r0 (8,4): loads [0, 0] -> tie -> 0. Instance 0: prefill 8 tok 0.0-2.0 (o=1), then
    #        decodes of one sequence, 1.25 s each: 2.0-3.25 (o=2), 3.25-... .
    # t=3.0  r1 (4,4): iterations starting before 3.0 have run: i0 is at o=2, left 2; i1 empty.
    #        loads [2, 0] -> 1. Instance 1: prefill 4 tok 3.0-4.5 (o=1).
    # t=3.1  r2 (2,1): i0 still o=2 (next iteration starts 3.25): 2; i1's prefill started at
    #        3.0 < 3.1, so it has run: o=1, left 3. loads [2, 3] -> 0.
    #        Instance 0 at 3.25: r2 waits, prefill first: 2 tok 3.25-4.5, r2 done (d=1);
    #        4.5-5.75 decode r0 (o=3). Instance 1 at 4.5: decode r1 4.5-5.75 (o=2).
    # t=4.6  r3 (4,2): loads [4-3, 4-2] = [1, 2] -> 0; now i0 holds r3's 4 prompt + 2 decode
    #        tokens: [1+6, 2] = [7, 2].
    # t=4.6  r4 (4,2): loads [7, 2] -> 1.
    # Round robin would give 0 1 0 1 0.
    assert instances("jsq", TIMED, 2) == [0, 1, 0, 0, 1]


def test_least_requests_and_jsq_differ_on_sizes():
    # All four arrive at t=0, nothing runs before the decisions. r0 is big (100, 100), the rest
    # (1, 1). least_requests counts requests: [0,0]->0, [1,0]->1, [1,1]->0, [2,1]->1.
    # JSQ counts tokens: [0,0]->0, [200,0]->1, [200,2]->1, [200,4]->1.
    rows = [(0.0, 100, 100), (0.0, 1, 1), (0.0, 1, 1), (0.0, 1, 1)]
    assert instances("least_requests", rows, 2) == [0, 1, 0, 1]
    assert instances("jsq", rows, 2) == [0, 1, 1, 1]
    # Requests that finish stop counting: on TIMED, r0 is still on i0 at 3.0 -> r1 to 1;
    # [1,1] at 3.1 -> 0; at 4.6 r2 has finished: [1,1] -> 0, then [2,1] -> 1.
    assert instances("least_requests", TIMED, 2) == [0, 1, 0, 0, 1]


def test_decode_balancer_ignores_prompts():
    # Same four requests but the big one has a huge prompt and one output token: decode left is
    # [1,0] after r0 -> r1 to 1 ([1,1]), r2 tie -> 0 ([2,1]), r3 -> 1. JSQ would keep sending
    # the small ones to 1 because of r0's 300 prompt tokens.
    rows = [(0.0, 300, 1), (0.0, 1, 1), (0.0, 1, 1), (0.0, 1, 1)]
    assert instances("decode_balancer", rows, 2) == [0, 1, 0, 1]
    assert instances("jsq", rows, 2) == [0, 1, 1, 1]


def test_power_of_two_seeded_and_picks_less_loaded_of_the_pair():
    rows = [(0.0, 5, 5)] * 12   # all at t=0: the load of an instance = requests routed there
    got = instances("power_of_two", rows, 4, seed=7)
    assert got == instances("power_of_two", rows, 4, seed=7)
    assert got != instances("power_of_two", rows, 4, seed=8)
    # Replay the draws: two distinct instances, the one with fewer requests, ties to the lower.
    rng, counts, expected = np.random.default_rng(7), [0] * 4, []
    for _ in rows:
        a, b = sorted(int(x) for x in rng.choice(4, size=2, replace=False))
        pick = b if counts[b] < counts[a] else a
        counts[pick] += 1
        expected.append(pick)
    assert got == expected
    assert instances("power_of_two", rows, 1) == [0] * 12


def test_random_is_seeded():
    rows = [(0.0, 5, 5)] * 20
    assert instances("random", rows, 3, seed=3) == instances("random", rows, 3, seed=3)
    assert instances("random", rows, 3, seed=3) == list(np.random.default_rng(3).integers(3, size=20))


def test_mixing_greedy_is_argmax_of_hand_computed_scores():
    # committed tokens: i0 holds (500, 500) -> 1000, i1 holds (300, 300) -> 600, i2 empty.
    # Head request r2: p = 30, predicted d = 20. Defaults grad1 3.2e-4, grad2 3.3e-5, eps 0.5,
    # alpha 0.5:
    #   i0: T_p = 3.2e-4 (900 + 1000) = 0.608 > 0.5 -> r_p = 1 - 0.608/0.5 = -0.216
    #       r_d = -3.3e-5 (1000 + 50) = -0.03465;  r = -0.125325
    #   i1: T_p = 3.2e-4 (900 + 600) = 0.48 -> r_p = 1; r_d = -3.3e-5 * 650 = -0.02145; r = 0.489275
    #   i2: T_p = 0.288 -> r_p = 1; r_d = -3.3e-5 * 50 = -0.00165; r = 0.499175   <- argmax
    rows = [(0.0, 500, 500), (0.0, 300, 300), (0.0, 30, 20)]
    c = loaded_cluster(3, rows, [0, 1])
    assert mixing_scores([1000.0, 600.0, 0.0], 30, 20.0, MixingParams()) == pytest.approx(
        [-0.125325, 0.489275, 0.499175], abs=1e-12)
    r = make_router("mixing_greedy")
    r.reset(np.random.default_rng(0), 3)
    assert r.select(c, 2) == 2
    # alpha = 1 keeps only the prompt term: i1 and i2 both score 1 -> tie -> the lower, 1.
    r = make_router("mixing_greedy", alpha=1.0)
    r.reset(np.random.default_rng(0), 3)
    assert r.select(c, 2) == 1


def test_kv_queue_scorer():
    # score = 1.0 * used/total + 1.0 * waiting/128. r0 -> i0 at t=0; by t=0.5 its prefill (which
    # started at 0) has run: i0 holds ceil(8/4) = 2 of 100 blocks, nothing waiting: 0.02.
    # r1 -> i1 at 0.5 waits there (its prefill starts at 0.5): 1/128 = 0.0078.
    # Head r2: default weights -> [0.02, 0.0078] -> 1; KV weight 0 -> [0, 0.0078] -> 0;
    # queue weight 0 -> [0.02, 0] -> 1; running share only -> [1/128, 0] -> 1.
    rows = [(0.0, 8, 8), (0.0, 8, 8), (0.0, 8, 8)]
    c = loaded_cluster(2, rows, [0], num_kv_blocks=100)
    c.advance_to(0.5)
    c.route(1)
    for opts, expected in [({}, 1), ({"w_kv": 0.0}, 0), ({"w_queue": 0.0}, 1),
                           ({"w_kv": 0.0, "w_queue": 0.0, "w_running": 1.0}, 1)]:
        r = make_router("kv_queue_scorer", **opts)
        r.reset(np.random.default_rng(0), 2)
        assert r.select(c, 2) == expected, opts


def test_dedicated_small_large_separates_heavy_requests():
    rng = np.random.default_rng(4)
    b = poisson_batch(rng, 120, 10.0, 40, 250)
    pred = b.decode_tokens * rng.uniform(0.7, 1.3, len(b))
    c = run_router(b, ClusterConfig(4), make_router("dedicated_small_large"), rng, 0.0, pred)
    inst = np.array(c.table.instance)
    heavy = np.maximum(pred, 1.0) >= 300
    assert heavy.any() and (~heavy).any()
    assert set(inst[heavy]) <= {2, 3} and set(inst[~heavy]) <= {0, 1}
    assert set(inst) == {0, 1, 2, 3}   # least-loaded within the group spreads over both
    r = make_router("dedicated_small_large", heavy_share=0.5)
    r.reset(rng, 3)   # 1.5 rounds half up: two heavy instances
    assert (r.light_instances, r.heavy_instances) == ((0,), (1, 2))
    r.reset(rng, 1)
    assert (r.light_instances, r.heavy_instances) == ((0,), (0,))
    r = make_router("dedicated_small_large", heavy_share=0.99)
    r.reset(rng, 4)   # light requests always keep one instance
    assert (r.light_instances, r.heavy_instances) == ((0,), (1, 2, 3))


# Min-Min queue: r0 (100, 50) is routed to i0 first; then, with bucket edges 30/120/240:
#   r1 p=10  d=29  bucket 0 -> 10 + 30  = 40
#   r2 p=12  d=20  bucket 0 -> 12 + 30  = 42   (by predicted tokens 32 < 39: r2 would go first)
#   r3 p=5   d=100 bucket 1 -> 5 + 120  = 125
#   r4 p=1   d=500 bucket 3 (open) -> 1 + 500 = 501
#   r5 p=50  d=200 bucket 2 -> 50 + 240 = 290
MINMIN_ROWS = [(0.0, 100, 50), (0.0, 10, 29), (0.0, 12, 20), (0.0, 5, 100), (0.0, 1, 500), (0.0, 50, 200)]
EDGES = (30, 120, 240)


def test_min_min_picks_shortest_job_onto_earliest_available():
    # Ready time (JSQ tokens, predicted): i0 = 150, i1 = 0.
    #   r1 (40)  -> i1 (0 < 150);        i1 = 10 + 29 = 39
    #   r2 (42)  -> i1 (39 < 150);       i1 = 39 + 32 = 71
    #   r3 (125) -> i1 (71 < 150);       i1 = 71 + 105 = 176
    #   r5 (290) -> i0 (150 < 176);      i0 = 150 + 250 = 400
    #   r4 (501) -> i1 (176 < 400)
    # Queue positions: [1,2,3,4,5] -> r1 at 0, r2 at 0, r3 at 0, then [4,5] -> r5 at 1, r4 at 0.
    b = batch(MINMIN_ROWS)
    c = Cluster(cfg(2), build_table(b, decode_scheme=BucketScheme(EDGES)), num_decode_buckets=4)
    c.advance_to(0.0)
    c.route(0)
    r = make_router("min_min", decode_edges_tokens=EDGES)
    r.reset(np.random.default_rng(0), 2)
    picks = []
    while c.queue:
        pos, inst = decide(c, r)
        picks.append((c.queue[pos], pos, inst))
        c.route(inst, pos)
    assert picks == [(1, 0, 1), (2, 0, 1), (3, 0, 1), (5, 1, 0), (4, 0, 1)]
    # Without edges jobs are sized by predicted tokens: r2 (32) before r1 (39).
    c = Cluster(cfg(2), build_table(b))
    c.advance_to(0.0)
    c.route(0)
    r = make_router("min_min")
    r.reset(np.random.default_rng(0), 2)
    assert c.queue[decide(c, r)[0]] == 2
    # Edges that do not match the table's buckets are an error, not a silent guess.
    c = Cluster(cfg(2), build_table(b, decode_scheme=BucketScheme(EDGES)), num_decode_buckets=4)
    c.advance_to(0.0)
    r = make_router("min_min", decode_edges_tokens=(30,))
    r.reset(np.random.default_rng(0), 2)
    with pytest.raises(ValueError, match="decode bucket"):
        decide(c, r)


def test_min_min_reorders_through_run_router():
    # One instance that runs one sequence at a time, so start order = routing order. All six
    # arrive at 0 and are routed at t=0 shortest first; r0 = 100 + 120 (d=50 is in bucket 1)
    # = 220 sits between r3 (125) and r5 (290): order 1, 2, 3, 0, 5, 4.
    c = run_router(batch(MINMIN_ROWS), cfg(1, max_num_seqs=1),
                   make_router("min_min", decode_edges_tokens=EDGES), np.random.default_rng(0), 0.1,
                   decode_scheme=BucketScheme(EDGES))
    starts = np.array(c.table.first_scheduled_s)
    assert list(np.argsort(starts, kind="stable")) == [1, 2, 3, 0, 5, 4]


def test_max_capacity_routes_only_at_ticks():
    rows = [(0.05, 4, 4), (0.3, 4, 4), (1.2, 4, 4), (1.5, 4, 4), (2.0, 4, 4)]
    c = run_router(batch(rows), cfg(2), make_router("max_capacity"), np.random.default_rng(0), 0.1)
    assert c.table.routed_s == [1.0, 1.0, 2.0, 2.0, 2.0]
    # Paper-faithful drivers route one request per interval: same ticks, same rule (a request
    # that arrived after the tick waits for the next one even while the round is being drained).
    c = run_router(batch(rows), cfg(2), make_router("max_capacity", period_s=0.5),
                   np.random.default_rng(0), 0.1)
    assert c.table.routed_s == [0.5, 0.5, 1.5, 1.5, 2.0]
    with pytest.raises(ConfigError, match="decision_interval_s"):
        run_router(batch(rows), cfg(2), make_router("max_capacity"), np.random.default_rng(0), 0.0)


def test_max_capacity_counts_promised_blocks_and_blocks_the_head():
    # 10 blocks of 4 tokens per instance. All arrive at 0.5; first round at t = 1.0.
    #   r0 (8, 8)   needs 4 blocks: capacities [10, 10] -> 0;  promised -> [6, 10]
    #   r1 (8, 8)   4:               [6, 10]  -> 1;            -> [6, 6]
    #   r2 (12, 12) 6:               [6, 6]   -> 0 (6-6 >= 0); -> [0, 6]
    #   r3 (4, 4)   2:               [0, 6]   -> 1;            -> [0, 4]
    #   r4 (16, 16) 8: fits nowhere -> the round ends; r5 (small) waits behind it.
    rows = [(0.5, 8, 8), (0.5, 8, 8), (0.5, 12, 12), (0.5, 4, 4), (0.5, 16, 16), (0.5, 1, 1)]
    c = run_router(batch(rows), cfg(2, num_kv_blocks=10), make_router("max_capacity"),
                   np.random.default_rng(0), 0.25)
    tb = c.table
    assert tb.instance[:4] == [0, 1, 0, 1] and tb.routed_s[:4] == [1.0] * 4
    assert tb.routed_s[4] > 1.0 and tb.routed_s[4] == int(tb.routed_s[4])
    assert tb.routed_s[5] == tb.routed_s[4]


class _NoDecodeTable:
    """The request table with the true output length hidden: a router must not read it."""

    def __init__(self, table):
        self._t = table

    def __getattr__(self, name):
        if name == "decode":
            raise AssertionError("a router read the true decode length")
        return getattr(self._t, name)


# Routers that simulate copies of the cluster: the simulator in the copy reads the true lengths
# of routed requests by design; tests/test_lookahead.py checks what such a router may see.
SIMULATING = ("lookahead",)


@pytest.mark.parametrize("name", [n for n in ROUTERS if n not in SIMULATING])
def test_routers_read_predictions_not_true_lengths(name):
    rows = [(0.0, 10 + i, 5 + 40 * i) for i in range(8)]
    c = loaded_cluster(3, rows, [0, 1, 2, 0])
    c.advance_to(1.5)
    view = SimpleNamespace(t=c.t, queue=c.queue, engines=c.engines, last_route_s=c.last_route_s,
                           speeds=c.speeds,
                           table=_NoDecodeTable(c.table))
    r = make_router(name)
    r.reset(np.random.default_rng(0), 3)
    choice = decide(view, r)
    assert choice is None or 0 <= choice[1] < 3


def stress_episode(name: str, seed: int):
    """80 requests at 15 req/s (up to 1,600 tokens), noisy predictions (x0.5-2), the
    completion-time buckets, and the options a router needs to run on them: the workload the
    every-router tests (here and in test_heterogeneous) drive each router through."""
    rng = np.random.default_rng(seed)
    b = poisson_batch(rng, 80, 15.0, 90, 250, max_tokens=1600)
    pred = b.decode_tokens * rng.uniform(0.5, 2.0, len(b))
    scheme = BucketScheme.completion_time()
    opts = {"decode_edges_tokens": scheme.edges_tokens} if name == "min_min" else {}
    if name == "lookahead":
        opts = {"see_future": True, "plan_horizon_s": 1.0, "decision_interval_s": 0.05}
    return b, pred, scheme, opts


@pytest.mark.parametrize("name", ROUTERS)
def test_every_router_finishes_an_episode(name):
    # Tight KV (64 blocks of 16 = 1,024 tokens) forces preemptions and rejects requests longer
    # than that; noisy predictions; invariants checked at every state change.
    b, pred, scheme, opts = stress_episode(name, 11)
    ccfg = ClusterConfig(3, EngineConfig(num_kv_blocks=64))
    intervals = [0.05] if make_router(name).defers else [0.0, 0.05]
    for dt in intervals:
        c = run_router(b, ccfg, make_router(name, **opts), np.random.default_rng(1), dt, pred,
                       decode_scheme=scheme, check=True)
        status = set(c.table.status)
        assert status <= {Status.FINISHED, Status.REJECTED}
        assert c.n_finished + c.n_rejected == len(b) and c.n_rejected > 0
        assert sum(e.n_preemptions for e in c.engines) > 0
        routed = np.array(c.table.routed_s)[np.array(c.table.status) == Status.FINISHED]
        arrived = b.arrival_s[np.array(c.table.status) == Status.FINISHED]
        assert np.all(routed >= arrived)


def test_registry_names_and_errors():
    assert ROUTERS == ("round_robin", "random", "jsq", "max_capacity", "min_min", "decode_balancer",
                       "dedicated_small_large", "least_requests", "power_of_two", "mixing_greedy",
                       "kv_queue_scorer", "late_binding", "lookahead", "prefix_affinity",
                       "prefix_affinity_approx", "slo_aware", "scored_binding")
    for name in ROUTERS:
        r = make_router(name)
        assert r.name == name and isinstance(r, Router)
        assert isinstance(r, QueueRouter) == (name in ("min_min", "late_binding", "lookahead",
                                                           "scored_binding"))
    with pytest.raises(ConfigError, match="unknown router 'rr'; allowed: .*round_robin"):
        make_router("rr")
    with pytest.raises(ConfigError, match="unknown router 'jsq' option.*: period_s"):
        make_router("jsq", period_s=1.0)
    with pytest.raises(ConfigError, match="heavy_sahre.*allowed: heavy_decode_tokens, heavy_share"):
        make_router("dedicated_small_large", heavy_sahre=0.5)
    with pytest.raises(ConfigError, match=r"router.dedicated_small_large.heavy_share=1.0 .*\(0.0, 1.0\)"):
        make_router("dedicated_small_large", heavy_share=1.0)
    with pytest.raises(ConfigError, match=r"router.max_capacity.period_s=0"):
        make_router("max_capacity", period_s=0)
    with pytest.raises(ConfigError, match="router.min_min.decode_edges_tokens"):
        make_router("min_min", decode_edges_tokens=(120, 30))
    with pytest.raises(ConfigError, match="router.mixing_greedy.alpha"):
        make_router("mixing_greedy", alpha=2.0)
    with pytest.raises(ConfigError, match="all 0"):
        make_router("kv_queue_scorer", w_kv=0.0, w_queue=0.0)
    assert router_options("kv_queue_scorer") == ("w_kv", "w_queue", "w_running")


def test_router_must_be_reset_for_the_cluster():
    c = loaded_cluster(2, [(0.0, 4, 4)], [])
    r = make_router("jsq")
    with pytest.raises(RuntimeError, match="reset"):
        r.select(c, 0)
    r.reset(np.random.default_rng(0), 3)
    with pytest.raises(RuntimeError, match="3 instances"):
        r.select(c, 0)


def test_decide_rejects_out_of_range_choices():
    c = loaded_cluster(2, [(0.0, 4, 4)], [])
    bad = SimpleNamespace(name="bad", defers=False, select=lambda cluster, rid: 2)
    with pytest.raises(ValueError, match=r"instance 2 .*\[0, 1\]"):
        decide(c, bad)
