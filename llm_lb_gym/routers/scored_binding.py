"""Scored binding: ``late_binding`` with its discrete choices made continuous, for policy search.

``late_binding`` (hold at the router, release the shortest predicted job first where KV has
room) is the best heuristic near and above capacity, and its few discrete options have a flat
optimum. A learned router that beats it has to find a better rule *near* it; per-state labels
from sampled futures were too noisy to say where (docs/policy_iteration.md). Whole episodes on
common seeds are not: the paired difference of two routers' mean E2E has ~1% SD per episode.
So this router is a parametric family around late_binding whose options *are* the parameter
vector that ``llm_lb_gym.agents.policy_search`` optimises on whole episodes:

- **order**: the eligible request with the largest score goes next, where
  ``score = -log(ideal_s) - prompt_weight * log1p(prompt_tokens) + age_per_s * wait_s
  - late_penalty * [its TTFT deadline has passed]``
  (ideal_s: predicted ideal latency, the env's ``inv_ideal``; wait_s: time at the router).
  ``prompt_weight`` trades prompt against decode length, ``age_per_s`` moves from shortest
  first towards oldest first, ``late_penalty`` > 0 sends requests that already missed their
  TTFT deadline to the back (SLO attainment; 0 and ignored without deadlines).
- **reservation**: a request counts ``prompt + reserve_frac * (predicted decode + hedge *
  (upper - predicted)) + (1 - reserve_frac) * tokens already generated`` (1: late_binding's
  ``full``; 0: ``prompt``), where ``upper`` is the predictor's upper quantile of the decode
  (``table.pred_hi``, ``predictor/calibration.py``): ``hedge`` > 0 reserves more for requests
  whose length the predictor is unsure of (0: the expected length only; no effect with the
  oracle, whose upper is the true length).
- **room**: late_binding's (free KV blocks minus what the instance's waiting requests will
  take) minus ``growth_frac`` x the blocks its running requests' predicted decode will still fill.
- **release gate**: it goes to an instance only if room - need >= watermark
  + ``room_margin`` x the instance's KV blocks (negative: overcommit), and the instance holds
  fewer than ``seq_cap_frac`` x its sequence slots.
- **instance**: among those it fits, the highest ``room / kv_blocks - work_weight x
  outstanding tokens / kv_tokens`` (0: late_binding's most room; outstanding tokens = prompt
  still to prefill + predicted decode left, the paper's JSQ measure).
- rounds (``period_s``, ``rounds``) and the starvation bound (``max_wait_s``): late_binding's.
- **hold bound** ``max_hold_s``: once the oldest held request has waited longer at the router,
  it goes out at once, to the instance with the most room among those with a free sequence
  slot (any instance when none has one), whether it fits or not: the router's wait, and with
  it the TTFT tail, is bounded by the option (None: no bound but the release guarantee's).

At ``ScoredBindingOptions.from_late_binding(o)`` (all weights 0, reserve_frac 1 or 0) it makes
exactly late_binding's decisions (tested), so a search started there starts at the teacher.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, fields

from .._validate import ConfigError, check_choice, check_range
from ..limits import check_period_s
from .base import work_left_tokens
from .late_binding import ROUNDS, LateBinding, LateBindingOptions


ORDER_WEIGHTS: dict[str, tuple[float, float]] = {
    "age_per_s": (0.0, 100.0),
    "prompt_weight": (-5.0, 5.0),
    "late_penalty": (-50.0, 50.0),
}
"""The order score's weights and their allowed ranges: the router's options and the env's
``action.order_weights`` (``order=scored`` candidates) share them."""


def order_key(table, t: float, age_per_s: float, prompt_weight: float, late_penalty: float):
    """The scored order of request ``r`` at time ``t`` (larger goes first): log of its inverse
    predicted ideal latency, minus ``prompt_weight`` per nat of (1 + prompt tokens), plus
    ``age_per_s`` per second waited, minus ``late_penalty`` once its TTFT deadline has passed
    (only with SLOs on); ties to the older request. One definition for the router and for the
    env's candidates, so a network over ``order=scored`` candidates sees scored_binding's first
    choice as candidate 0."""
    inv, arr, prompt = table.inv_ideal, table.arrival_s, table.prompt
    late = late_penalty if table.slo_on else 0.0
    dl = table.ttft_deadline_s

    def key(r: int) -> tuple[float, int]:
        wait = t - arr[r]
        s = math.log(inv[r]) - prompt_weight * math.log1p(prompt[r]) + age_per_s * wait
        if late and wait > dl[r]:
            s -= late
        return s, -r

    return key


@dataclass(frozen=True)
class ScoredBindingOptions:
    """Defaults: late_binding's class defaults (shortest first, prompt reservation, 0.1 s rounds
    since the last release); every weight at 0."""

    period_s: float = 0.1
    """Time between release rounds (late_binding's); 0 releases at every decision time, else
    in [1e-4, 10] s."""
    rounds: str = "since_release"
    """How rounds open (late_binding's ``rounds``)."""
    max_wait_s: float | None = None
    """Requests waiting longer go first, oldest first (late_binding's; None: no bound)."""
    reserve_frac: float = 0.0
    """Share of the predicted decode a released request is counted to need (1 = ``full``,
    0 = ``prompt``), in [0, 1]."""
    age_per_s: float = 0.0
    """Order score per second of waiting at the router (nats/s), in [0, 100]."""
    prompt_weight: float = 0.0
    """Order score per nat of (1 + prompt tokens), subtracted, in [-5, 5] (> 0: short prompts first)."""
    late_penalty: float = 0.0
    """Order score subtracted once a request's TTFT deadline has passed, in [-50, 50]."""
    room_margin: float = 0.0
    """Extra free KV required after admission, as a fraction of the instance's blocks, in [-1, 1]."""
    growth_frac: float = 0.0
    """Share of the running requests' predicted decode still to generate counted against an
    instance's room, in [0, 1] (late_binding counts only what is allocated now, so the running
    requests' growth is what preempts)."""
    seq_cap_frac: float = 1.0
    """Share of an instance's sequence slots the router fills, in (0, 1]."""
    work_weight: float = 0.0
    """Weight of an instance's outstanding tokens against its room (fractions of its KV), in [0, 100]."""
    hedge: float = 0.0
    """Share of the gap between the predictor's upper quantile and its expected decode added to
    a request's reservation, in [0, 1] (0: the expected length)."""
    max_hold_s: float | None = None
    """Longest the router holds its oldest request before releasing it regardless of room, in
    (0, 3600] s; None: no bound of its own."""

    def __post_init__(self) -> None:
        p = "router.scored_binding"
        check_period_s(f"{p}.period_s", self.period_s, 10.0)
        check_choice(f"{p}.rounds", self.rounds, ROUNDS)
        if self.max_wait_s is not None:
            check_range(f"{p}.max_wait_s", self.max_wait_s, 0.0, lo_open=True)
        check_range(f"{p}.reserve_frac", self.reserve_frac, 0.0, 1.0)
        for name, (lo, hi) in ORDER_WEIGHTS.items():
            check_range(f"{p}.{name}", getattr(self, name), lo, hi)
        check_range(f"{p}.room_margin", self.room_margin, -1.0, 1.0)
        check_range(f"{p}.growth_frac", self.growth_frac, 0.0, 1.0)
        check_range(f"{p}.seq_cap_frac", self.seq_cap_frac, 0.0, 1.0, lo_open=True)
        check_range(f"{p}.work_weight", self.work_weight, 0.0, 100.0)
        check_range(f"{p}.hedge", self.hedge, 0.0, 1.0)
        if self.max_hold_s is not None:
            check_range(f"{p}.max_hold_s", self.max_hold_s, 0.0, 3600.0, lo_open=True)

    @property
    def order(self) -> str:
        """Always ``shortest`` (late_binding's order, which the score reduces to at zero weights)."""
        return "shortest"

    @classmethod
    def from_late_binding(cls, options: LateBindingOptions | dict) -> "ScoredBindingOptions":
        """The point of the family that decides as late_binding with ``options`` does."""
        o = options if isinstance(options, LateBindingOptions) else LateBindingOptions(**options)
        if o.order != "shortest":
            raise ConfigError(f"router.scored_binding: late_binding order={o.order!r} has no "
                              f"equivalent point; allowed: 'shortest'")
        return cls(period_s=o.period_s, rounds=o.rounds, max_wait_s=o.max_wait_s,
                   reserve_frac=1.0 if o.reserve == "full" else 0.0)

    def as_dict(self) -> dict:
        """Plain keyword options (``make_router("scored_binding", **d)``, YAML)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class ScoredBinding(LateBinding):
    name = "scored_binding"
    defers = True
    Options = ScoredBindingOptions

    def need_blocks(self, cluster, rid: int, instance: int = 0) -> int:
        tb, e = cluster.table, cluster.engines[instance]
        o = self.options
        f = o.reserve_frac
        pred = tb.pred[rid]
        if o.hedge:
            pred += o.hedge * (tb.pred_hi[rid] - pred)
        # f = 1 or 0 gives late_binding's full / prompt counts exactly (0 * x == 0).
        tokens = tb.prompt[rid] + f * pred + (1.0 - f) * tb.o_base[rid]
        return min(math.ceil(tokens / e.bs), e.total_blocks - e.watermark)

    def select_from_queue(self, cluster):
        cap = self.options.max_hold_s
        if cap is not None:
            q = cluster.queue
            if q and cluster.t - cluster.table.arrival_s[q[0]] > cap:
                self._require_reset(cluster)
                return 0, self.overdue_instance(cluster)
        return super().select_from_queue(cluster)

    def overdue_instance(self, cluster) -> int:
        """Where a request past ``max_hold_s`` goes: the highest ``instance_value`` among the
        instances with a free sequence slot (all of them when none has one)."""
        rooms = self.rooms(cluster)
        eng = cluster.engines
        free = [i for i, e in enumerate(eng) if e.B + len(e.prefilling) + e.num_waiting < e.max_seqs]
        best, best_v = None, None
        for i in free or range(len(eng)):
            v = self.instance_value(cluster, rooms[i], i)
            if best_v is None or v > best_v:
                best, best_v = i, v
        return best

    def rooms(self, cluster) -> list:
        out = super().rooms(cluster)
        g = self.options.growth_frac
        if g == 0.0:
            return out
        return [room - g * (e.decode_tokens_left() - e.wait_left) / e.bs
                for room, e in zip(out, cluster.engines)]

    def order(self, cluster, cutoff_s: float) -> list[int]:
        o = self.options
        if o.age_per_s == 0.0 and o.prompt_weight == 0.0 and o.late_penalty == 0.0:
            return super().order(cluster, cutoff_s)
        q, tb, t = cluster.queue, cluster.table, cluster.t
        if o.max_wait_s is not None and q and t - tb.arrival_s[q[0]] > o.max_wait_s:
            return [0]
        if q and not tb.inv_ideal[q[0]] > 0.0:
            raise ValueError("router 'scored_binding' with order weights needs the requests' "
                             "predicted ideal latencies (table.inv_ideal, which the env fills; "
                             "drive.build_table leaves them 0)")
        key = order_key(tb, t, o.age_per_s, o.prompt_weight, o.late_penalty)
        arr = tb.arrival_s
        return heapq.nlargest(1, (i for i in range(len(q)) if arr[q[i]] <= cutoff_s),
                              key=lambda i: key(q[i]))

    def fits(self, cluster, room: int, need: int, i: int) -> bool:
        o = self.options
        if o.room_margin == 0.0 and o.seq_cap_frac == 1.0:
            return super().fits(cluster, room, need, i)
        e = cluster.engines[i]
        return (room - need >= e.watermark + o.room_margin * e.total_blocks
                and e.B + len(e.prefilling) + e.num_waiting < o.seq_cap_frac * e.max_seqs)

    def instance_value(self, cluster, room: int, i: int) -> float:
        w = self.options.work_weight
        if w == 0.0:
            return room
        e = cluster.engines[i]
        return room / e.total_blocks - w * work_left_tokens(e) / (e.total_blocks * e.bs)
