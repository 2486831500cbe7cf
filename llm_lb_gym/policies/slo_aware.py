"""SLO-aware routing: predict each instance's TTFT and TBT for the request, route against its
deadlines.

What production gateways do for latency SLOs (the Kubernetes Gateway API Inference Extension's
SLO-aware router and llm-d's predicted-latency scheduling): for every candidate server predict
the request's time to first token and time per output token from the server's live state, keep
the servers predicted to meet both of the request's deadlines (positive *headroom*), pick one of
them, and when none can, pick the one with the smallest weighted violation (TTFT weighted
higher: a late first token is what users notice). The gateways learn their predictor online
from streamed latencies; here the predictor is analytic, from the instance's state and its
latency model (``engine.latency``, used only through its methods), so it needs no training.

Per instance, O(1) from the engine's aggregates (so O(instances) per decision):

- TTFT = (time the request has already waited) + (rest of the iteration in progress)
  + the prefill of the prompt tokens queued ahead plus its own, in iterations of at most the
  token budget (``iteration_s(prefill_tokens=ahead + p, prefill_attn_pairs=p^2)`` plus one
  ``iteration_s()`` per further iteration) + the time to the instance's first predicted
  completion when it lacks the free KV blocks or sequence slots to admit them now.
- TBT = one decode step of the batch it will join: ``iteration_s(decode_seqs=B', ctx)`` with
  B' = running + prefilling + waiting + 1 and ctx = their context now + the queued prompts +
  its prompt + half its predicted output (its mean context over its decode).

It does not predict the decode stalls later prefills will cause (non-chunked vLLM pauses every
running decode for each prefill), so it underestimates TBT on busy instances; ``slo_buffer``
> 1 compensates by requiring predicted latency x buffer <= deadline.

Headroom of a kind = (deadline - predicted) / deadline; an instance meets the SLO when both
are >= 0. ``pick``: ``most_headroom`` spreads load (the min of the two headrooms, highest
wins); ``least_headroom`` packs (lowest nonnegative min headroom wins), keeping emptier
instances for requests that need them. With no deadlines on the request (``env.slo=None``),
both headrooms are minus the predicted latencies in seconds: it routes to the lowest predicted
latency, as the gateway does without SLO headers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._validate import check_choice, check_range
from .base import RouterBase

PICKS = ("most_headroom", "least_headroom")


@dataclass(frozen=True)
class SLOAwareOptions:
    pick: str = "most_headroom"
    """Among instances predicted to meet both deadlines: ``most_headroom`` (spread) or
    ``least_headroom`` (pack)."""
    ttft_weight: float = 0.8
    """Weight of the TTFT violation when no instance meets both deadlines (TBT gets
    1 - ttft_weight); the gateway's default weighs TTFT 0.8."""
    slo_buffer: float = 1.0
    """Predicted latencies are multiplied by this before the comparison with the deadlines
    (> 1: conservative)."""

    def __post_init__(self) -> None:
        check_choice("router.slo_aware.pick", self.pick, PICKS)
        check_range("router.slo_aware.ttft_weight", self.ttft_weight, 0.0, 1.0)
        check_range("router.slo_aware.slo_buffer", self.slo_buffer, 1.0, 100.0)


def predict_ttft_tbt_s(engine, lat, now: float, prompt_tokens: int,
                       pred_decode_tokens: float) -> tuple[float, float]:
    """(TTFT from now, mean TBT) predicted for a request routed to ``engine`` at ``now``, with
    ``lat`` the instance's latency model (the module docstring gives the model)."""
    p = prompt_tokens
    ahead = engine.pending_prefill_tokens
    tokens = ahead + p
    iters = -(-tokens // engine.budget) if engine.budget > 0 else 1
    ttft = max(engine.t - now, 0.0) + lat.iteration_s(prefill_tokens=tokens, prefill_attn_pairs=p * p)
    if iters > 1:
        ttft += (iters - 1) * lat.iteration_s()
    waiting = engine.num_waiting
    seqs = engine.B + len(engine.prefilling) + waiting + 1
    need_blocks = -(-tokens // engine.bs)
    if seqs > engine.max_seqs or need_blocks > engine.free_blocks - engine.watermark:
        ttft += engine.earliest_completion_s()
    ctx_now = engine.S_at + engine.B * (engine.G - engine.G_S) if engine.B else 0
    tbt = lat.iteration_s(decode_seqs=seqs, decode_ctx_tokens=ctx_now + tokens + pred_decode_tokens / 2.0)
    return ttft, tbt


class SLOAware(RouterBase):
    name = "slo_aware"
    Options = SLOAwareOptions

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        o = self.options
        tb = cluster.table
        now = cluster.t
        waited = now - tb.arrival_s[rid]
        p, pred = tb.prompt[rid], tb.pred[rid]
        ttft_dl, tbt_dl = tb.ttft_deadline_s[rid], tb.tbt_deadline_s[rid]
        if not tb.slo_on:   # no deadlines: deadline 0, i.e. lowest predicted latency
            ttft_dl = tbt_dl = 0.0
        w, buf = o.ttft_weight, o.slo_buffer
        best_fit = best_miss = -1
        fit_key = miss_key = 0.0
        for i, e in enumerate(cluster.engines):
            ttft, tbt = predict_ttft_tbt_s(e, e.latency, now, p, pred)
            h_ttft = _headroom(ttft_dl, buf * (waited + ttft))
            h_tbt = _headroom(tbt_dl, buf * tbt)
            if h_ttft >= 0.0 and h_tbt >= 0.0:
                key = min(h_ttft, h_tbt)
                if o.pick == "least_headroom":
                    key = -key
                if best_fit < 0 or key > fit_key:
                    best_fit, fit_key = i, key
            elif best_fit < 0:
                key = w * min(h_ttft, 0.0) + (1.0 - w) * min(h_tbt, 0.0)   # <= 0; closest to 0 wins
                if best_miss < 0 or key > miss_key:
                    best_miss, miss_key = i, key
        return best_fit if best_fit >= 0 else best_miss


def _headroom(deadline: float, predicted: float) -> float:
    """(deadline - predicted) / deadline: 1 with no deadline (inf), minus the prediction in
    seconds for a deadline of 0 (no SLO: lowest latency wins)."""
    if deadline == math.inf:
        return 1.0
    if deadline <= 0.0:
        return -predicted
    return (deadline - predicted) / deadline
