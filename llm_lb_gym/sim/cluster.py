"""m instances behind one router queue, and the clock that drives them.

The cluster owns the episode's ``RequestTable``. ``advance_to(T)`` moves arrivals up to ``T``
into the router queue (or rejects them, with a reason) and runs every instance's iterations that
start before ``T``; ``route(i)`` sends the head of the router queue to instance ``i`` at the
current time. The router (a policy, or the Gymnasium env) decides between those two calls.

Instances may differ (``ClusterConfig.instances``: GPU, model, engine options); ``speeds``
(``sim/speed.py``) says how fast and how large each is. A mixed cluster rejects at arrival a
request that does not fit *every* instance (context window, KV cache, token budget), so no
routing choice can strand a request on an instance that can never run it; with one model on
every instance only tiny KV caches make this stricter than the largest instance's limit.
"""

from __future__ import annotations

import math
import sys
from collections import deque

from ._compiled import engine_class, module_like
from .config import ClusterConfig
from .request import RequestTable, Status
from .speed import InstanceSpeeds

_QUEUED, _REJECTED = Status.QUEUED, Status.REJECTED   # read once: an Enum attribute costs ~0.1 us


class Cluster:
    def __init__(self, cfg: ClusterConfig, table: RequestTable, *, num_prompt_buckets: int = 1,
                 num_decode_buckets: int = 1, check: bool = False, count_penalty: bool = False):
        self.cfg = cfg
        self.table = table
        Engine = engine_class()
        self.engines = [
            Engine(i, e, table, fast=cfg.fast, num_prompt_buckets=num_prompt_buckets,
                   num_decode_buckets=num_decode_buckets, check=check)
            for i, e in enumerate(cfg.engines)
        ]
        # advance_to's, tick's and run_grid's passes over the instances, from the engine's
        # implementation (compiled or pure): C loops in the compiled build.
        self._advance_all = sys.modules[Engine.__module__].advance_all
        pen = module_like(Engine, "penalty")
        self._tick_penalties, self._grid_penalties = pen.tick_penalties, pen.grid_penalties
        self._grid_penalties_until_idle = pen.grid_penalties_until_idle
        self.speeds = InstanceSpeeds(cfg.engines)
        # The in-system penalty: sum of inv_ideal * (1 - progress) (the paper's), or with
        # ``count_penalty`` the number of requests in the system (total latency's integrand).
        self.count_penalty = count_penalty
        for eng in self.engines:
            eng.count_mode = count_penalty
        self.t = 0.0
        self.queue: deque[int] = deque()
        self.queue_penalty = 0.0     # the penalty of the router queue (nothing generated there)
        self._next = 0               # next request (in arrival order) not yet arrived
        self.n_rejected = 0
        self.n_routed = 0
        # When the router last sent each instance a request (-inf: never): routers that release
        # in rounds read it, so they need no memory of their own and can label any state.
        self.last_route_s = [-math.inf] * cfg.num_instances
        # Rejection limits: a request must fit every instance (identical instances: all or none).
        # ceil(tokens / block_size) <= blocks  <=>  tokens <= blocks * block_size (integers).
        engines = cfg.engines
        self._max_len = min(e.context_len for e in engines)
        self._max_kv_tokens = min((e.total_blocks - e.watermark_blocks) * e.block_size for e in engines)
        budgets = [e.token_budget for e in engines if not e.chunked_prefill]
        self._max_batched = min(budgets) if budgets else None

    @property
    def max_request_tokens(self) -> int:
        """Most prompt + output tokens a request may have without being rejected at arrival."""
        return min(self._max_len, self._max_kv_tokens)

    # ----------------------------------------------------------------- time
    @property
    def next_arrival_s(self) -> float:
        return self.table.arrival_s[self._next] if self._next < self.table.n else math.inf

    @property
    def n_arrived(self) -> int:
        """Requests whose arrival time has passed (queued, routed, finished or rejected)."""
        return self._next

    @property
    def all_arrived(self) -> bool:
        return self._next >= self.table.n

    def advance_to(self, T: float) -> None:
        """Move the clock to ``T``: arrivals at or before ``T`` join the router queue."""
        if T < self.t:
            raise ValueError(f"time cannot go backwards: {T} < {self.t}")
        tb = self.table
        arr = tb.arrival_s
        while self._next < tb.n and arr[self._next] <= T:
            self._arrive(self._next)
            self._next += 1
        self._advance_all(self.engines, T)
        self.t = T

    def _arrive(self, rid: int) -> None:
        tb = self.table
        p, d = tb.prompt[rid], tb.decode[rid]
        reason = None
        if p + d > self._max_len:
            reason = "exceeds_max_model_len"
        elif p + d > self._max_kv_tokens:
            reason = "exceeds_kv_capacity"
        elif self._max_batched is not None and p > self._max_batched:
            reason = "exceeds_max_num_batched_tokens"
        if reason is not None:
            tb.status[rid] = _REJECTED
            tb.reject_reason[rid] = reason
            self.n_rejected += 1
            return
        tb.status[rid] = _QUEUED
        self.queue.append(rid)
        self.queue_penalty += 1.0 if self.count_penalty else tb.inv_ideal[rid]

    # -------------------------------------------------------------- routing
    def route(self, instance: int, position: int = 0) -> int:
        """Send the router queue's request at ``position`` (0 = head) to ``instance`` now;
        returns its id. Positions other than the head serve reordering routers (Min-Min)."""
        if not self.queue:
            raise IndexError("route() with an empty router queue")
        if position:
            rid = self.queue[position]
            del self.queue[position]
        else:
            rid = self.queue.popleft()
        self.queue_penalty -= 1.0 if self.count_penalty else self.table.inv_ideal[rid]
        if not self.queue:
            self.queue_penalty = 0.0
        self.engines[instance].add(rid, self.t)
        self.last_route_s[instance] = self.t
        self.n_routed += 1
        return rid

    def run_to_completion(self) -> None:
        """Run every instance until it is idle (the router queue must be empty)."""
        assert not self.queue and self.all_arrived
        for e in self.engines:
            e.advance_to(math.inf)
        self.t = max([self.t] + [e.t for e in self.engines])

    # ---------------------------------------------------------------- views
    def tick(self, T: float) -> tuple[float, int]:
        """``advance_to(T)``, then (in-system penalty, requests finished so far): the env's
        per-interval call, in one pass over the instances."""
        if T < self.t:
            raise ValueError(f"time cannot go backwards: {T} < {self.t}")
        tb = self.table
        if self._next < tb.n and tb.arrival_s[self._next] <= T:
            self.advance_to(T)
        pen, fin = self._tick_penalties(self.engines, T)
        self.t = T
        return pen + self.queue_penalty, fin

    def run_grid(self, k0: int, dt: float, k1: int | None, w: float = 1.0,
                 g: float = 1.0) -> tuple[float, int, int, float, float]:
        """Advance over the grid points (k0+1)dt .. k1 dt with an empty router queue and no
        arrival before k1 dt (``k1=None``: after the last arrival, until every instance is
        idle). Returns (sum over the points of the in-system penalty, the last point's index,
        requests finished meanwhile, the same completions weighted by their point, and the
        weighted completions within their SLO deadlines). Point j
        weighs ``w * g**(j - k0 - 1)``: ``g`` is a learner's per-interval discount, and
        ``w = g = 1`` gives the plain sums. Same numbers as calling ``tick`` at each point,
        summed per instance instead of per point."""
        assert not self.queue
        if k1 is None:
            assert self.all_arrived
            total, fin, fin_w, met_w, k_end = self._grid_penalties_until_idle(self.engines, k0, dt, w, g)
            T = k_end * dt
        else:
            assert k1 > k0 and (self._next >= self.table.n or self.table.arrival_s[self._next] > (k1 - 1) * dt)
            total, fin, fin_w, met_w = self._grid_penalties(self.engines, k0, dt, k1, w, g)
            T = k1 * dt
            self.advance_to(T)     # the last point takes the arrivals (instances are there already)
            total += (w * g ** (k1 - k0 - 1)) * self.queue_penalty   # exactly queue_penalty if w = g = 1
            k_end = k1
        if T > self.t:
            self.advance_to(T)   # idle instances only: nothing finishes here
        return total, k_end, fin, fin_w, met_w

    @property
    def n_finished(self) -> int:
        n = 0
        for e in self.engines:
            n += e.n_finished
        return n

    @property
    def n_slo_met(self) -> int:
        """Requests finished within both SLO deadlines so far (counted only with
        ``table.count_slo``, which the env sets for its slo reward; 0 otherwise)."""
        n = 0
        for e in self.engines:
            n += e.n_slo_met
        return n

    @property
    def done(self) -> bool:
        """Every request of the episode has finished or been rejected."""
        return self.n_finished + self.n_rejected == self.table.n

    def penalty(self) -> float:
        """Reward's in-system penalty: router queue plus every instance."""
        return self.queue_penalty + sum(e.penalty() for e in self.engines)

    @property
    def head(self) -> int | None:
        return self.queue[0] if self.queue else None
