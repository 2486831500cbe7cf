"""Predicted progress of one instance's requests, as sums that are O(1) to read at any G.

Two estimates read at every env step depend on each request's progress
``f_j = min(o_j / pred_j, 1)`` (``o_j`` generated tokens, ``pred_j`` predicted decode tokens):
- the reward's in-system penalty ``sum_j inv_ideal_j (1 - f_j)`` (``penalty.py`` sums it over
  the decision grid; ``inv_ideal_j`` = 1 / request j's ideal latency);
- the predicted decode tokens left ``sum_j max(pred_j - o_j, 0)`` (routers, ``token_load``).

Waiting and prefilling requests do not generate, so theirs are constants (``pen_static``,
``wait_left``). A running request generates one token per decode iteration of the engine's
lockstep counter ``G`` (``o = o_base + G - g_base``, ``engine.py``), so until it reaches its
prediction its terms are linear in ``G``: the sums ``A1 - A2 - G A3`` (penalty) and
``wA1 - wA2 - G wA3`` (tokens left) hold them all, and a heap of the points where a request
reaches its prediction (``sat_heap``) says when a term must be dropped. The engine reports each
change of its request set here (``enter_prompt`` ... ``leave_running``); it lives apart from the
engine because it is the RL-facing estimate, not the instance's dynamics, and must change with
the reward, not with the scheduler.

Compiled by Cython with ``progress.pxd`` (see ``_compiled.py``): the engine holds a typed
reference, so these are C calls.
"""

from __future__ import annotations

import heapq
import math

from .request import Status

_RUNNING = Status.RUNNING


class ProgressSums:
    """The sums over one instance's requests (reads the request table ``table``)."""

    def __init__(self, table):
        self.table = table
        self.pen_static = 0.0        # waiting / prefilling (o frozen)
        self.wait_left = 0.0         # sum max(pred - o, 0) over waiting / prefilling
        self.pA1 = self.pA2 = self.pA3 = 0.0   # running, unsaturated: A1 - A2 - G A3
        self.wA1 = self.wA2 = 0.0
        self.wA3 = 0                 # running predicted decode left: wA1 - wA2 - G wA3
        self.sat_heap: list[tuple[int, int, int]] = []   # (G at which o >= pred, admit seq, rid)
        self.n_sat_running = 0       # running requests past their prediction
        self.version = 0             # bumped by every membership change (penalty cache key)
        self._pen_G = -1
        self._pen_version = -1
        self._pen_value = 0.0

    # ------------------------------------------------------------------ changes
    def enter_prompt(self, rid: int) -> None:
        """``rid`` waits or prefills with ``o_base`` tokens generated."""
        tb = self.table
        self.version += 1
        o, pred = tb.o_base[rid], tb.pred[rid]
        f = o / pred
        self.pen_static += tb.inv_ideal[rid] * (1.0 - f if f < 1.0 else 0.0)
        self.wait_left += pred - o if pred > o else 0.0

    def leave_prompt(self, rid: int) -> None:
        tb = self.table
        self.version += 1
        o, pred = tb.o_base[rid], tb.pred[rid]
        f = o / pred
        self.pen_static -= tb.inv_ideal[rid] * (1.0 - f if f < 1.0 else 0.0)
        self.wait_left -= pred - o if pred > o else 0.0

    def join_running(self, rid: int, o: int, G: int, seq: int) -> None:
        """``rid`` (admission number ``seq``) has generated ``o`` tokens and decodes from
        iteration ``G`` on."""
        tb = self.table
        self.version += 1
        pred = tb.pred[rid]
        if o >= pred:
            tb.saturated[rid] = True
            self.n_sat_running += 1
        else:
            tb.saturated[rid] = False
            w, k = tb.inv_ideal[rid], o - G
            self.pA1 += w
            self.pA2 += w * k / pred
            self.pA3 += w / pred
            self.wA1 += pred
            self.wA2 += k
            self.wA3 += 1
            heapq.heappush(self.sat_heap, (G + math.ceil(pred - o), seq, rid))

    def leave_running(self, rid: int, running_left: int) -> None:
        """``rid`` leaves the running batch (finished or preempted); ``running_left`` stay."""
        self.version += 1
        if self.table.saturated[rid]:
            self.n_sat_running -= 1
        else:
            self.drop_linear_terms(rid)   # also marks its sat_heap entry stale
        if not running_left:   # resync the float sums so rounding cannot accumulate
            self.pA1 = self.pA2 = self.pA3 = self.wA1 = self.wA2 = 0.0

    def clear(self) -> None:
        """The instance is empty: drop the float residue, so an idle penalty is exactly 0."""
        self.pen_static = 0.0
        self.version += 1

    def pop_saturated(self, G: int) -> None:
        """Drop the linear terms of the running requests that reach their prediction by ``G``."""
        h, tb = self.sat_heap, self.table
        while h and h[0][0] <= G:
            _, seq, rid = heapq.heappop(h)
            if tb.admit_seq[rid] != seq or tb.saturated[rid] or tb.status[rid] != _RUNNING:
                continue
            self.drop_linear_terms(rid)
            self.n_sat_running += 1

    def drop_linear_terms(self, rid: int) -> None:
        """Remove a running request's linear-in-G terms (penalty and decode-left sums): it has
        reached its predicted length, or it leaves the running set."""
        tb = self.table
        w, pred, k = tb.inv_ideal[rid], tb.pred[rid], tb.o_base[rid] - tb.g_base[rid]
        self.pA1 -= w
        self.pA2 -= w * k / pred
        self.pA3 -= w / pred
        self.wA1 -= pred
        self.wA2 -= k
        self.wA3 -= 1
        tb.saturated[rid] = True

    # -------------------------------------------------------------------- reads
    def penalty(self, G: int) -> float:
        """``sum_j inv_ideal_j (1 - f_j)`` at decode iteration ``G``. Cached per (G, membership
        version): between iterations it cannot change."""
        if G == self._pen_G and self.version == self._pen_version:
            return self._pen_value
        h = self.sat_heap
        if h and h[0][0] <= G:
            self.pop_saturated(G)
        run = self.pA1 - self.pA2 - G * self.pA3
        value = self.pen_static + (run if run > 0.0 else 0.0)
        self._pen_G, self._pen_version, self._pen_value = G, self.version, value
        return value

    def decode_tokens_left(self, G: int) -> float:
        """Predicted decode tokens still to generate at ``G`` (clipped at 0 per request)."""
        self.pop_saturated(G)
        run = self.wA1 - self.wA2 - G * self.wA3
        return self.wait_left + (run if run > 0.0 else 0.0)
