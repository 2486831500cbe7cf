"""Replay a corpus case (``corpus.py``) through the simulator and compute what the benchmark printed.

The benchmark clients of the corpus (``vllm bench serve``) send every request at once
(``batch``: ``--request-rate inf``), keep ``concurrency`` requests in flight (``closed``:
``--max-concurrency``, the next request sent when a response ends) or send at a rate
(``poisson``: ``--request-rate R``, :func:`poisson_arrivals`). Each is driven here on one
simulated instance, and the figures are computed as the client computes them: duration =
last response's end - the benchmark's start (the first send; at a rate, the first gap comes
before it); TTFT = first token seen - send; TPOT = (end - first token) / (output tokens - 1)
per request; E2E = end - send; with a frontend (``sim/frontend.py``) the
times are those the client sees. ITL (the gaps between a request's streamed tokens, over every
token of every request) comes from the engine's decode iterations (``Engine.record_token_gaps``):
each running request's token follows its previous one by the iteration's duration (plus any
prefill-only iteration between them), the engine-side gap, without the frontend's output work.

Closed loop: after each instance iteration (or frontend event), responses that ended by then
release the next sends at that instant, so a send lags the response end it waits for by at most
the float noise of the event times. A run that re-sends an earlier run's prompts
(``Workload.resends``: the client's dataset drawn again with the same seed and count) is
replayed after that run's loop on the same engine, the prompts carrying the same hash chains,
so with prefix caching they are found cached as vLLM finds them; only the second loop is measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..sim.cluster import Cluster
from ..sim.config import ClusterConfig, EngineConfig
from ..sim.request import RequestTable, Status
from ..sim.clock import run_on_arrival
from .corpus import Case


@dataclass(frozen=True)
class Replay:
    """Simulated figures of one case (the keys of ``corpus.METRICS``) and run counters."""

    figures: dict[str, float]
    preemptions: int
    rejected: int


def token_gaps(gap_log) -> tuple[np.ndarray, np.ndarray]:
    """(gaps in s, tokens per gap), sorted by gap, from an engine's ``gap_log``: a run
    (a, c, j0, j1, n) is n tokens after a gap of a + c j for each j in j0 .. j1 - 1."""
    gaps, counts = [], []
    for a, c, j0, j1, n in gap_log or ():
        gaps.append(a + c * np.arange(j0, j1, dtype=float))
        counts.append(np.full(j1 - j0, n, dtype=np.int64))
    if not gaps:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    g, w = np.concatenate(gaps), np.concatenate(counts)
    order = np.argsort(g, kind="stable")
    return g[order], w[order]


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The ``q`` quantile (0-1) of ``values`` (sorted) each repeated ``weights`` times: the
    smallest value with at least that share of the weight at or below it."""
    if not len(values):
        return math.nan
    cum = np.cumsum(weights)
    return float(values[min(int(np.searchsorted(cum, q * cum[-1], side="left")), len(values) - 1)])


def _figures(table: RequestTable, start_s: float | None = None, gap_log=None, rows=None) -> dict[str, float]:
    """The client's figures over ``rows`` (default: every request) that finished."""
    st = np.fromiter(table.status, np.int64, table.n)
    fin = st == Status.FINISHED
    if rows is not None:
        fin &= np.isin(np.arange(table.n), rows)
    arr = np.asarray(table.arrival_s)[fin]
    first = np.asarray(table.first_token_s)[fin]
    end = np.asarray(table.finish_s)[fin]
    if table.frontends:
        for fe in table.frontends:
            fe.flush()
        sf, se = np.asarray(table.seen_first_token_s)[fin], np.asarray(table.seen_finish_s)[fin]
        first, end = np.where(np.isnan(sf), first, sf), np.where(np.isnan(se), end, se)
    dec = np.asarray(table.decode)[fin]
    multi = dec > 1
    tpot = (end[multi] - first[multi]) / (dec[multi] - 1)
    ttft, e2e = first - arr, end - arr
    start = float(arr.min()) if start_s is None else start_s
    gaps, w = token_gaps(gap_log)
    # p95s: numpy's default (linear) percentile, the one ``vllm bench serve`` computes
    return {"duration_s": float(end.max() - start), "mean_ttft_ms": 1e3 * float(ttft.mean()),
            "median_ttft_ms": 1e3 * float(np.median(ttft)), "p95_ttft_ms": 1e3 * float(np.percentile(ttft, 95)),
            "median_tpot_ms": 1e3 * float(np.median(tpot)) if len(tpot) else math.nan,
            "median_itl_ms": 1e3 * weighted_quantile(gaps, w, 0.5),
            "median_e2e_ms": 1e3 * float(np.median(e2e)), "p95_e2e_ms": 1e3 * float(np.percentile(e2e, 95))}


def replay(case: Case, engine: EngineConfig) -> Replay:
    """Run ``case``'s requests on one instance of ``engine``; the client's figures."""
    w = case.workload
    n = w.num_requests
    p, d = lengths(w)
    if w.kind == "poisson":   # one run per seed, the figures averaged (as the corpus's are)
        runs = [_open_loop(poisson_arrivals(n, float(w.rate_rps), seed), p, d, engine) for seed in w.seeds]
        figs = [_figures(t, start_s=0.0, gap_log=c.engines[0].gap_log) for t, c in runs]
        return Replay({k: float(np.mean([f[k] for f in figs])) for k in figs[0]},
                      sum(sum(t.preemptions) for t, _ in runs), sum(c.n_rejected for _, c in runs))
    if w.kind == "batch":
        table, cluster = _open_loop(np.zeros(n), p, d, engine)
    elif w.resends:
        k = int(w.resend_requests)
        table, cluster = _closed_loop(n, int(w.concurrency), p, d, engine, warm=(k, int(w.resend_concurrency)))
        return Replay(_figures(table, gap_log=cluster.engines[0].gap_log, rows=np.arange(k, k + n)),
                      sum(table.preemptions[k:]), cluster.n_rejected)
    else:
        table, cluster = _closed_loop(n, int(w.concurrency), p, d, engine)
    return Replay(_figures(table, gap_log=cluster.engines[0].gap_log), sum(table.preemptions), cluster.n_rejected)


def poisson_arrivals(n: int, rate_rps: float, seed: int) -> np.ndarray:
    """Send times of ``n`` requests at ``rate_rps`` as ``vllm bench serve`` makes them with
    burstiness 1 (``get_request``): exponential gaps (the first one before the first request),
    summed, then scaled so that the last request is sent at exactly ``n / rate_rps`` (the client
    does this "for stabilizing the throughput data from different random seeds"). The draws
    are this module's (numpy's default generator on ``seed``), not the client's: the same
    process, not the same sequence."""
    t = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate_rps, n))
    return t * ((n / rate_rps) / t[-1])


def _open_loop(arrival_s, p, d, engine: EngineConfig):
    """Requests sent at fixed times (all at once, or at a rate), on one instance."""
    table = RequestTable(np.asarray(arrival_s, dtype=float), p, d, d)
    cluster = Cluster(ClusterConfig(num_instances=1, engine=engine), table)
    cluster.engines[0].record_token_gaps()

    def route_all(c: Cluster) -> None:
        while c.queue:
            c.route(0)

    run_on_arrival(cluster, route_all)
    assert cluster.done, "replay ended with requests neither finished nor rejected"
    for fe in table.frontends:   # the client-side times of the last responses (sim/frontend.py)
        fe.flush()
    return table, cluster


def lengths(w) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output tokens per request (``Workload.length_spread``)."""
    n = w.num_requests
    if not w.length_spread:
        return np.full(n, w.prompt_tokens), np.full(n, w.output_tokens)
    rng = np.random.default_rng(0)
    out = []
    for mean in (w.prompt_tokens, w.output_tokens):
        x = rng.lognormal(0.0, w.length_spread, n)
        out.append(np.maximum(1, np.round(mean * x / x.mean())).astype(np.int64))
    return out[0], out[1]


def _ended(table: RequestTable, rid: int, T: float) -> bool:
    """Whether the client has the whole response of ``rid`` by time ``T``."""
    if table.status[rid] != Status.FINISHED:
        return False
    if table.frontends:
        end = table.seen_finish_s[rid]
        return end == end and end <= T
    return table.finish_s[rid] <= T


def _closed_loop(n: int, c: int, p, d, engine: EngineConfig, warm: tuple[int, int] | None = None):
    """``c`` requests in flight; each response end sends the next request at that instant.

    ``warm = (k, c0)``: first the first ``k`` of the ``n`` prompts in a closed loop of ``c0`` (an
    earlier run whose prompts are this one's first, ``Workload.resends``), then, once all of them
    ended, the measured loop (requests ``k .. k + n - 1``): request ``k + i`` carries the prompt
    hashes of request ``i`` for ``i < k``, so with prefix caching those prompts are found cached
    as vLLM would find them, and fresh ones after."""
    inf = math.inf
    k, c0 = warm if warm is not None else (n, c)
    phases = [(0, k, c0)] if warm is None else [(0, k, c0), (k, n, c)]
    total = sum(m for _, m, _ in phases)
    hashes = None
    if warm is not None:
        H = engine.block_size
        one = [tuple(i * 1_000_000 + b for b in range(int(p[i]) // H)) for i in range(n)]
        hashes, p, d = one[:k] + one, np.concatenate([p[:k], p]), np.concatenate([d[:k], d])
    arrival = [inf] * total
    for i in range(min(c0, k)):
        arrival[i] = 0.0
    table = RequestTable(arrival, p, d, d, prefix_hashes=hashes, hash_block_tokens=engine.block_size if hashes else 0)
    cluster = Cluster(ClusterConfig(num_instances=1, engine=engine), table)
    eng = cluster.engines[0]
    eng.record_token_gaps()
    fe = eng.fe
    phase = 0
    sent, end = min(c0, k), k
    inflight = list(range(sent))
    T = 0.0
    while True:
        cluster.advance_to(T)
        while cluster.queue:
            cluster.route(0)
        if fe is not None:
            fe.advance(T)
        still = []
        for rid in inflight:
            if _ended(table, rid, T):
                if sent < end:
                    table.arrival_s[sent] = T
                    still.append(sent)
                    sent += 1
            else:
                still.append(rid)
        inflight = still
        if not inflight and phase + 1 < len(phases):   # the next client run starts
            phase += 1
            start, m, cp = phases[phase]
            end = start + m
            eng.record_token_gaps()   # the measured run's token gaps only
            inflight = list(range(start, start + min(cp, m)))
            for rid in inflight:
                table.arrival_s[rid] = T
            sent = start + len(inflight)
            continue
        if not inflight:
            break
        if cluster.next_arrival_s <= T:
            continue
        # The next instant anything can end: the current iteration's end (or the start of one
        # due now), or a frontend event.
        runnable = eng.B or eng.prefilling or eng.num_waiting > eng.fe_count or (fe is not None and fe.ready)
        nxt = eng.t if eng.t > T else (math.nextafter(T, inf) if runnable else inf)
        if fe is not None:   # advanced to T above, so its next event is later
            nxt = min(nxt, fe.next_event_s())
        if nxt == inf:
            raise RuntimeError("closed loop stalled: requests in flight but nothing scheduled")
        T = nxt
    for f in table.frontends:
        f.flush()
    return table, cluster
