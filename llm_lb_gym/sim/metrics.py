"""Per-request latencies and the episode summary.

Every request ends finished or rejected; the summary says how many of each, so nothing is lost
silently. Percentiles use numpy's default (linear) interpolation.
"""

from __future__ import annotations

import math

import numpy as np

from .request import RequestTable, Status
from .slo import slo_metrics

METRIC_KEYS = (
    "num_requests", "completed", "rejected", "mean_e2e_s", "p50_e2e_s", "p90_e2e_s", "p99_e2e_s",
    "mean_ttft_s", "p50_ttft_s", "p99_ttft_s", "mean_tbt_s", "p99_tbt_s", "mean_router_wait_s",
    "p99_router_wait_s", "max_router_wait_s", "mean_queue_wait_s", "preemptions", "makespan_s",
    "throughput_rps",
)
SLO_METRIC_KEYS = ("slo_met", "slo_attainment_pct", "slo_ttft_attainment_pct",
                   "slo_tbt_attainment_pct", "goodput_rps")
"""Added to the summary when the episode's requests have deadlines (``sim/slo.py``)."""


class Columns:
    """``table.column(name)``, each converted once: one summary reads some columns several
    times, and the conversions were most of its cost (the env computes it at every episode's
    end). The arrays are shared: callers must not modify them."""

    def __init__(self, table: RequestTable):
        self.table = table
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, name: str) -> np.ndarray:
        col = self._cache.get(name)
        if col is None:
            col = self._cache[name] = self.table.column(name)
        return col


def request_latencies(table: RequestTable, column: Columns | None = None) -> dict[str, np.ndarray]:
    """Derived per-request arrays over the finished requests (``column``: a ``Columns`` of
    ``table`` to share conversions with)."""
    column = column or Columns(table)
    status = column("status")
    fin = status == Status.FINISHED
    arr = column("arrival_s")[fin]
    first = column("first_token_s")[fin]
    finish = column("finish_s")[fin]
    if table.frontends:   # the times the client sees, where a frontend delivers them
        first, finish = _client_times(table, column, fin, first, finish)
    routed = column("routed_s")[fin]
    sched = column("first_scheduled_s")[fin]
    dec = column("decode")[fin]
    multi = dec > 1
    tbt = (finish[multi] - first[multi]) / (dec[multi] - 1)
    return {
        "e2e_s": finish - arr,
        "ttft_s": first - arr,
        "tbt_s": tbt,
        "router_wait_s": routed - arr,
        "queue_wait_s": sched - routed,
        "instance": column("instance")[fin],
        "preemptions": column("preemptions")[fin],
    }


def _client_times(table: RequestTable, column: Columns, fin: np.ndarray, first: np.ndarray,
                  finish: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First token and finish as the client sees them: after the frontend's work on the
    response (``sim/frontend.py``; its jobs are run to completion first), the engine's times on
    instances without a frontend."""
    for fe in table.frontends:
        fe.flush()
    seen_first = column("seen_first_token_s")[fin]
    seen_finish = column("seen_finish_s")[fin]
    return (np.where(np.isnan(seen_first), first, seen_first),
            np.where(np.isnan(seen_finish), finish, seen_finish))


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else math.nan


def _pcts(x: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """``[_pct(x, q) for q in qs]`` in one call (the same values: one partition, the same
    interpolation per q)."""
    return [float(v) for v in np.percentile(x, qs)] if len(x) else [math.nan] * len(qs)


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if len(x) else math.nan


PREFIX_KEYS = ("prefix_hit_rate", "prefix_saved_tokens", "prefix_recompute_hit_rate",
               "prefix_evictions")


def prefix_cache_metrics(engines) -> dict[str, float]:
    """Prefix caching per instance (suffix ``_i<k>``) and in total (0 where caching is off).

    ``prefix_hit_rate``: prompt tokens reused from the cache / prompt tokens, over the first
    admission of every request (a hit is capped to leave one token to compute).
    ``prefix_recompute_hit_rate``: the same over readmissions after preemption (prompt +
    generated tokens recomputed), counted apart so preemption cannot inflate the first.
    ``prefix_saved_tokens``: prefill tokens not computed thanks to the cache, both kinds.
    ``prefix_evictions``: cached hash blocks evicted to make room. ``prefix_caching``: 1 if any
    instance caches (tables print "n/a" in the prefix columns otherwise)."""
    out: dict[str, float] = {}
    tot = [0, 0, 0, 0, 0]
    for e in engines:
        kv = e.kv
        c = (kv.pc_tokens, kv.pc_hit_tokens, kv.pc_re_tokens, kv.pc_re_hit_tokens, kv.pc_evictions)
        tot = [a + b for a, b in zip(tot, c)]
        out[f"prefix_hit_rate_i{e.index}"] = c[1] / c[0] if c[0] else 0.0
        out[f"prefix_saved_tokens_i{e.index}"] = c[1] + c[3]
    out["prefix_hit_rate"] = tot[1] / tot[0] if tot[0] else 0.0
    out["prefix_saved_tokens"] = tot[1] + tot[3]
    out["prefix_recompute_hit_rate"] = tot[3] / tot[2] if tot[2] else 0.0
    out["prefix_evictions"] = tot[4]
    out["prefix_caching"] = float(any(e.pc for e in engines))   # 0: the columns above mean nothing
    return out


def episode_metrics(table: RequestTable) -> dict[str, float]:
    """The episode summary: counts, latency means and percentiles, throughput, and with
    deadlines SLO attainment and goodput (``SLO_METRIC_KEYS``)."""
    column = Columns(table)
    lat = request_latencies(table, column)
    status = column("status")
    n_fin = int(np.sum(status == Status.FINISHED))
    n_rej = int(np.sum(status == Status.REJECTED))
    e2e, ttft, tbt = lat["e2e_s"], lat["ttft_s"], lat["tbt_s"]
    if n_fin:
        fin = status == Status.FINISHED
        last = column("finish_s")[fin]
        if table.frontends:
            last = np.fmax(last, column("seen_finish_s")[fin])
        makespan = float(np.max(last) - np.min(column("arrival_s")))
    else:
        makespan = 0.0
    e2e50, e2e90, e2e99 = _pcts(e2e, (50, 90, 99))
    ttft50, ttft99 = _pcts(ttft, (50, 99))
    out = {
        "num_requests": table.n, "completed": n_fin, "rejected": n_rej,
        "mean_e2e_s": _mean(e2e), "p50_e2e_s": e2e50, "p90_e2e_s": e2e90,
        "p99_e2e_s": e2e99, "mean_ttft_s": _mean(ttft), "p50_ttft_s": ttft50,
        "p99_ttft_s": ttft99, "mean_tbt_s": _mean(tbt), "p99_tbt_s": _pct(tbt, 99),
        "mean_router_wait_s": _mean(lat["router_wait_s"]),
        # The tail of the router wait: how long a router that holds requests (late binding,
        # shortest-first) lets the unlucky ones wait, i.e. whether its starvation bound holds.
        "p99_router_wait_s": _pct(lat["router_wait_s"], 99),
        "max_router_wait_s": float(np.max(lat["router_wait_s"])) if len(e2e) else math.nan,
        "mean_queue_wait_s": _mean(lat["queue_wait_s"]),
        "preemptions": int(np.sum(column("preemptions"))),
        "makespan_s": makespan,
        "throughput_rps": n_fin / makespan if makespan > 0 else 0.0,
    }
    if table.slo_on:
        out.update(slo_metrics(table, makespan, column))
    reasons = [r for r in table.reject_reason if r is not None]
    for reason in sorted(set(reasons)):
        out[f"rejected_{reason}"] = reasons.count(reason)
    return out
