"""Late binding: hold requests at the router, release the shortest first where KV has room.

Maximum Capacity Usage (``max_capacity``) showed what wins near and above capacity: keep
requests at the router until an instance has the KV cache to run them (fewer preemptions), and
release them in rounds (a round's requests share one prefill iteration instead of interrupting
the running decodes one by one; on the V100 preset an iteration's fixed cost is ~16 ms). This
router keeps that and adds the one lever MCU lacks: *which* queued request goes next. Releasing
the shortest predicted job first is what queueing theory prescribes for mean latency once
requests wait (SRPT), and in an overloaded cluster, where most requests wait, it is worth far
more than any choice of instance.

Per decision (the env's grid, or every ``period_s`` in rounds):

- eligible requests: those in the router queue (with ``period_s > 0``: those that had arrived
  by the current round's tick, as in MCU), ordered by ``order``: ``shortest`` = smallest
  predicted ideal latency (prompt and predicted decode through the latency model, the env's
  ``inv_ideal``), ties by arrival; ``oldest`` = arrival order. Requests waiting longer than
  ``max_wait_s`` come first, oldest first: the starvation bound.
- room on instance i = its free KV blocks minus the blocks its not-yet-admitted requests will
  take, where a request takes ``reserve``: ``full`` = prompt + predicted decode (nothing
  preempts if predictions hold; MCU's rule) or ``prompt`` = prompt (+ tokens already generated)
  only (more requests in flight, some preemptions: better when KV is scarce).
- the first eligible request goes to the instance with the most room, if it fits there (room
  - need >= the watermark, and the instance has a free sequence slot); otherwise the router
  defers (head of line in the chosen order: a large request is not overtaken forever by a stream
  of small ones that fit, because its own wait ages it past ``max_wait_s``).

A request whose need exceeds an empty instance's KV is capped at what an empty instance offers,
so it still goes to an idle instance and nothing waits forever (as in MCU).

Mixed clusters: room and need are each instance's own (free blocks, block size, KV size); the
instance choice stays "most room" (capacity, not speed), as in MCU.

Measured (``llm_lb_gym.experiments.evaluate``, docs/reproduction.md): near capacity (4 x V100, 52 req/s),
rounds of 1 s with full reservation cut mean E2E ~27% vs round robin (MCU: ~21%); in the
KV-limited overloaded setting, continuous release with prompt reservation cuts it ~70%.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from .._validate import check_choice, check_range
from ..limits import check_period_s
from .base import RouterBase

ORDERS = ("shortest", "oldest")
RESERVES = ("full", "prompt")
ROUNDS = ("global", "since_release", "per_instance")
_TICK_SLACK = 1e-9   # a grid time a few ulps below a tick counts as the tick (as in MCU)


@dataclass(frozen=True)
class LateBindingOptions:
    """Defaults: the options tuned for the default setting (4 x V100, task mix, 20 req/s; tuned
    on validation seeds with ``llm_lb_gym.experiments.tune_late_binding``). Other settings set theirs in
    their experiment's ``eval.policy_options.late_binding`` (conf/experiment/*.yaml), which every
    entry point reads; MCU's rule is ``period_s=1.0, rounds=global, reserve=full``."""

    period_s: float = 0.1
    """Time between release rounds; 0 releases at every decision time. 0 or [1e-4, 1e9] s
    (``limits.check_period_s``); however long, no request is held without bound
    (``routers/release.py``)."""
    order: str = "shortest"
    """Which eligible request goes next: shortest (predicted ideal latency) or oldest."""
    reserve: str = "prompt"
    """KV a released request is counted to need: full (prompt + predicted decode) or prompt."""
    max_wait_s: float | None = None
    """Requests waiting longer than this at the router go first, oldest first (None: no bound)."""
    rounds: str = "since_release"
    """``global``: rounds at k * period_s on the clock (MCU's). ``since_release``: a round opens
    once period_s has passed since the router last released a request and stays open for the
    rest of that decision time: the same batching, but a function of what the env observes
    (``time_since_route``; it reads ``cluster.last_route_s``, so it can label states another
    policy reached), so an agent can imitate it. ``per_instance``: each instance takes a
    batch at most every period_s (measured: much worse, the first instance to open takes the
    whole queue)."""

    def __post_init__(self) -> None:
        check_period_s("router.late_binding.period_s", self.period_s)
        check_choice("router.late_binding.order", self.order, ORDERS)
        check_choice("router.late_binding.reserve", self.reserve, RESERVES)
        if self.max_wait_s is not None:
            check_range("router.late_binding.max_wait_s", self.max_wait_s, 0.0, lo_open=True)
        check_choice("router.late_binding.rounds", self.rounds, ROUNDS)


class LateBinding(RouterBase):
    name = "late_binding"
    defers = True
    Options = LateBindingOptions

    def reset(self, rng, num_instances: int) -> None:
        super().reset(rng, num_instances)
        self._tick = -1
        self._closed = False

    def need_blocks(self, cluster, rid: int, instance: int = 0) -> int:
        """KV blocks ``rid`` is counted to need on ``instance`` (capped at its empty cache)."""
        tb, e = cluster.table, cluster.engines[instance]
        tokens = tb.prompt[rid] + (tb.pred[rid] if self.options.reserve == "full" else tb.o_base[rid])
        return min(math.ceil(tokens / e.bs), e.total_blocks - e.watermark)

    def rooms(self, cluster) -> list[int]:
        """Free KV blocks minus what each instance's waiting requests will take."""
        out = []
        for i, e in enumerate(cluster.engines):
            room = e.free_blocks
            for q in (e.preempted_q, e.waiting_q):
                for r in q:
                    room -= self.need_blocks(cluster, r, i)
            out.append(room)
        return out

    def order(self, cluster, cutoff_s: float) -> list[int]:
        """Queue positions of the eligible requests, best first (only the first matters)."""
        q, tb, t = cluster.queue, cluster.table, cluster.t
        cap = self.options.max_wait_s
        if cap is not None and q and t - tb.arrival_s[q[0]] > cap:
            return [0]                       # the queue is in arrival order: the oldest is overdue
        if self.options.order == "oldest":
            return [0] if q and tb.arrival_s[q[0]] <= cutoff_s else []
        inv, arr = tb.inv_ideal, tb.arrival_s
        best = heapq.nlargest(1, (i for i in range(len(q)) if arr[q[i]] <= cutoff_s),
                              key=lambda i: (inv[q[i]], -q[i]))
        return best

    def round_cutoff(self, cluster) -> float | None:
        """Latest arrival time eligible now (``inf``: any), or None while no round is open."""
        p = self.options.period_s
        t = cluster.t
        if p > 0 and self.options.rounds == "since_release":
            last = max(cluster.last_route_s)
            if not (t - last >= p * (1 - _TICK_SLACK) or last == t):
                return None
        elif p > 0 and self.options.rounds != "per_instance":
            k = math.floor(t / p + _TICK_SLACK)
            if k != self._tick:
                self._tick, self._closed = k, False
            if self._closed:
                return None
            return k * p * (1 + _TICK_SLACK)
        return math.inf

    def fits(self, cluster, room: int, need: int, i: int) -> bool:
        """Whether instance ``i`` with ``room`` blocks takes a request needing ``need`` now."""
        e = cluster.engines[i]
        return room - need >= e.watermark and e.B + len(e.prefilling) + e.num_waiting < e.max_seqs

    def instance_for(self, cluster, rid: int) -> int | None:
        """The instance the chosen request goes to (the highest ``instance_value`` among those it
        fits; ties to the lowest index), or None."""
        p, t = self.options.period_s, cluster.t
        per_instance = p > 0 and self.options.rounds == "per_instance"
        last_route = cluster.last_route_s
        homogeneous = cluster.speeds.homogeneous
        need = self.need_blocks(cluster, rid)
        best, best_room = None, None
        for i, room in enumerate(self.rooms(cluster)):
            if not homogeneous:
                need = self.need_blocks(cluster, rid, i)
            if per_instance and not (t - last_route[i] >= p * (1 - _TICK_SLACK)
                                     or last_route[i] == t):
                continue
            if self.fits(cluster, room, need, i):
                v = self.instance_value(cluster, room, i)
                if best_room is None or v > best_room:
                    best, best_room = i, v
        return best

    def instance_value(self, cluster, room: int, i: int) -> float:
        """How much the router prefers instance ``i`` among those the request fits: its room."""
        return room

    def select_from_queue(self, cluster) -> tuple[int, int] | None:
        self._require_reset(cluster)
        cutoff = self.round_cutoff(cluster)
        if cutoff is None:
            return None
        pick = self.order(cluster, cutoff)
        if not pick:
            return None
        pos = pick[0]
        best = self.instance_for(cluster, cluster.queue[pos])
        if best is None:
            self._closed = True
            return None
        return pos, best

    def select(self, cluster, rid: int) -> int | None:
        """Head-of-line use (drivers that cannot reorder): the head goes out if it fits."""
        choice = self.select_from_queue(cluster)
        if choice is None or choice[0] != 0:
            return None
        return choice[1]

