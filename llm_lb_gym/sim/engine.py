"""One vLLM-style inference instance: the lifecycle of its requests and its clock.

Semantics: ``docs/simulator_semantics.md`` (the contract shared with the naive step-by-step
reference in ``reference.py``; tests compare the two).

Where each concern lives (each file compiled as its own extension, ``_compiled.py``):
- ``engine.py`` (here): routing in (``add``), time (``advance_to``: prefill, mixed and decode
  iterations), the running batch and its lockstep decode, finishing and preempting, the O(1)
  aggregates below, observations and estimates for routers, invariants (``_check``);
- ``scheduler.py`` (``sched``): the waiting queue and which requests are admitted next;
- ``kv_cache.py`` (``kv``): KV blocks and the prefix cache;
- ``iteration_timing.py`` (``timing``): how long an iteration takes;
- ``progress.py`` (``progress``): the requests' predicted progress as sums O(1) at any G: the
  reward's in-system penalty and the predicted decode tokens left (the engine reports each
  change of its request set there);
- ``penalty.py``: that penalty summed over the decision grid, across the instances.

Why it is fast. Between events (a route to this instance, a completion, a KV shortage) every
running sequence gains one token per decode iteration, in lockstep. So the engine keeps a
decode-iteration counter ``G`` and stores, per running request, its generated tokens ``o_base``
at counter ``g_base``; ``o(G) = o_base + G - g_base`` needs no per-iteration update. Aggregates
make a stretch of k identical decode iterations O(1):
- context sum ``S(G) = S_at + B (G - G_S)``, so k iterations last ``k a + c k (k-1) / 2`` with
  ``a = dec_a[B] + dec_c[B] S(G)`` and ``c = dec_c[B] B`` (``iteration_timing.py``);
- a sequence needs a new block every ``block_size`` iterations at a fixed phase, so per-phase
  counts give the block demand of any stretch and the first iteration that runs out;
- completions come from a heap keyed by the iteration in which each request ends;
- the reward's in-system penalty and the work-left estimates are linear in ``G`` per request
  until the prediction is reached, so sums of coefficients (plus a heap of saturation points)
  give them in O(1) (``progress.py``).
``fast=False`` runs the same logic one iteration at a time (the reference mode).
"""

from __future__ import annotations

import heapq
import math
from itertools import chain

from .config import EngineConfig
from .frontend import Frontend
from .iteration_timing import IterationTiming, iterations_before
from .output_stream import OutputStream
from .kv_cache import KVCache
from .progress import ProgressSums
from .scheduler import Scheduler
from .request import RequestTable, Status

INF = math.inf
# Status members as module constants: one global lookup in the hot paths instead of two.
_WAITING, _PREFILLING, _RUNNING, _FINISHED = Status.WAITING, Status.PREFILLING, Status.RUNNING, Status.FINISHED


class Engine:
    """A single instance. The cluster calls ``add`` (route) and ``advance_to`` (time)."""

    def __init__(self, index: int, cfg: EngineConfig, table: RequestTable, *, fast: bool = True,
                 num_prompt_buckets: int = 1, num_decode_buckets: int = 1, check: bool = False):
        lat = cfg.latency_model
        self.index = index
        self.table = table
        self.fast = fast
        self.check = check
        self.timing = IterationTiming(lat, cfg.max_num_seqs, cfg.async_scheduling)   # iteration durations
        self.latency = lat      # the model itself, for routers' predictions (slo_aware)
        self.kv = KVCache(index, cfg, table)   # KV blocks and the prefix cache
        self.chunked = cfg.chunked_prefill
        self.chunk_alloc = cfg.kv_allocation == "chunk"   # blocks per prefill chunk (vLLM V1)
        self.sched = Scheduler(cfg, table, self.kv)   # the waiting queue and admission
        # Clock and KV state.
        self.t = 0.0            # the next iteration starts no earlier than this (end of the last)
        self.G = 0              # decode iterations run so far (lockstep counter)
        self._used_G = 0        # kv.used counts the running set's blocks as of this iteration
        # Admitted requests (ids; the waiting ones are in ``sched``).
        self.prefilling: list[int] = []
        self.running: dict[int, None] = {}   # insertion order = admission order
        self.B = 0
        self.S_at = 0
        self.G_S = 0
        self.fin_heap: list[tuple[int, int, int]] = []   # (iteration it completes in, admit seq, rid)
        self.phase_cnt = [0] * self.kv.bs
        self.admit_counter = 0
        self._blocked = False    # waiting requests known not to be admissible until an event
        # Async scheduling (``EngineConfig.async_scheduling``): the next iteration is scheduled
        # while the current one runs, so requests that reach the waiting queue after that (its
        # last ``pend_n`` entries) are first seen by the iteration after next (``_hidden_step``).
        self.asynch = cfg.async_scheduling
        self.pend_n = 0
        self._plan_dirty = True
        self._g_fin_end = INF
        self._g_ex = INF
        # Counters.
        self.n_finished = 0
        self.n_preemptions = 0
        self.n_iterations = 0
        self.n_prefill_iterations = 0
        self.n_slo_met = 0          # finished within both SLO deadlines (if table.count_slo; sim/slo.py)
        self.count_mode = False     # penalty() counts requests instead (the env's latency reward)
        # Observation aggregates.
        self.prompt_counts = [0] * num_prompt_buckets   # requests in prompt phase per bucket
        self.decode_counts = [0] * num_decode_buckets   # requests in decode phase per bucket
        self.committed_tokens = 0.0   # sum of prompt + predicted decode tokens on this instance
        self.pending_prefill_tokens = 0  # prompt (+ recompute) tokens not yet computed
        # The in-system penalty and the predicted decode tokens left, O(1) at any G.
        self.progress = ProgressSums(table)
        # The server's frontend (``frontend.py``): requests in its input stage count as waiting
        # but reach the waiting queue only at ``fe_next`` or later. None: routed requests join
        # the waiting queue at once (every preset without ``engine.frontend``).
        self.fe = (Frontend(cfg.frontend_model, table, OutputStream)   # (the compiled one with this engine)
                   if cfg.frontend_model is not None else None)
        self.fe_wake = self.fe is not None and bool(cfg.frontend_model.wake_s)
        # Its output work (``FrontendModel.output_token_s``) streams with the decode iterations:
        # runs of them are reported to it (``Frontend.stream``, ``_fe_flush``).
        self.fe_out = self.fe is not None and cfg.frontend_model.output_token_s > 0.0
        # Lazily: the decode iterations before G = _fe_G are reported; the stretch's later ones
        # go at its end, before the running set changes, or when the frontend advances (it asks).
        self._fe_G = 0
        if self.fe_out:
            self.fe.source = self
        self.fe_count = 0       # requests in the frontend's input stage
        self.fe_next = INF      # no input completes before this (INF: none in the frontend)
        # Token gaps (opt-in, ``record_token_gaps``): runs of decode iterations as (a, c, j0, j1,
        # n) = n running requests each got a token after a gap of a + c j, j = j0 .. j1 - 1.
        self.gap_log = None
        self._gap_stall = 0.0   # prefill-only iterations since the last decode (no chunking)
        self._gap_stall_n = 0   # the running requests they stalled

    # ------------------------------------------------------------------ public API
    @property
    def num_waiting(self) -> int:
        return len(self.sched.preempted_q) + len(self.sched.waiting_q) + self.fe_count

    @property
    def num_requests(self) -> int:
        return self.num_waiting + len(self.prefilling) + self.B

    @property
    def free_blocks(self) -> int:
        """KV blocks neither held nor cached-in-use (evictable cached blocks count as free), as
        of now: what routers read. The scheduler and the decode planner compute the same
        ``total_blocks - used`` inline on their hot paths."""
        self._sync_used()
        return self.kv.total_blocks - self.kv.used

    # The KV cache's figures under the names routers and metrics have always read (kv_cache.py).
    @property
    def used(self) -> int:
        """KV blocks held as of decode iteration ``_used_G`` (``free_blocks`` syncs first)."""
        return self.kv.used

    @used.setter
    def used(self, value: int) -> None:   # tests make an instance look busy
        self.kv.used = value

    @property
    def peak_used(self) -> int:
        return self.kv.peak_used

    @property
    def total_blocks(self) -> int:
        return self.kv.total_blocks

    @property
    def watermark(self) -> int:
        return self.kv.watermark

    @property
    def bs(self) -> int:
        return self.kv.bs

    @property
    def pc(self) -> bool:
        return self.kv.pc

    @property
    def wait_left(self) -> float:
        """Predicted decode tokens of the waiting and prefilling requests (``progress.py``;
        the ``wait`` observation feature reads it, like ``serve/view.py``'s)."""
        return self.progress.wait_left

    # The scheduler's (scheduler.py), likewise.
    @property
    def preempted_q(self) -> list:
        return self.sched.preempted_q

    @property
    def waiting_q(self) -> list:
        return self.sched.waiting_q

    @property
    def max_seqs(self) -> int:
        return self.sched.max_seqs

    @property
    def budget(self) -> int:
        """Tokens per iteration (``EngineConfig.token_budget``)."""
        return self.sched.budget

    @property
    def scheduler(self) -> str:
        return self.sched.name

    def _sync_used(self) -> None:
        """Bring ``kv.used`` to the current G: the running set is unchanged since ``_used_G``
        (every membership change syncs first), so the per-phase counts give the demand."""
        if self._used_G != self.G:
            self.kv.grow(self._demand(self._used_G, self.G - self._used_G))
            self._used_G = self.G

    def idle(self) -> bool:
        return not (self.B or self.prefilling or self.sched.preempted_q or self.sched.waiting_q
                    or self.fe_count)

    def add(self, rid: int, now: float) -> None:
        """Route request ``rid`` here at time ``now`` (after ``advance_to(now)``)."""
        tb = self.table
        wake = 0.0
        if self.idle() and self.t <= now:
            # A server woken from idleness answers later (``FrontendModel.wake_s``): idle = nothing
            # in flight and the last iteration over, since that iteration's end.
            if self.fe_wake:
                wake = self.fe.model.wake_delay_s(now - self.t)
            self.t = now
        tb.status[rid] = _WAITING
        tb.instance[rid] = self.index
        tb.routed_s[rid] = now
        self.committed_tokens += tb.prompt[rid] + tb.pred[rid]
        self._enter_prompt_phase(rid)
        if self.fe is not None:   # the frontend's input work first (``_fe_release``)
            self.fe.arrive(rid, now, wake)
            self.fe_count += 1
            self.fe_next = self.fe.next_release_s()
            return
        self.sched.waiting_q.append(rid)
        if self.asynch:
            self.pend_n += 1
        self._blocked = False

    def _fe_release(self) -> None:
        """Bring the frontend to the clock and move the requests whose input work is done by
        then into the waiting queue (in the order it finished them)."""
        fe = self.fe
        fe.advance(self.t)
        ready = fe.take_ready(self.t)
        if ready:
            self.sched.waiting_q.extend(ready)
            self.fe_count -= len(ready)
            if self.asynch:
                self.pend_n += len(ready)
            self._blocked = False
        self.fe_next = fe.next_release_s()

    def advance_to(self, T: float) -> None:
        """Run every iteration that starts strictly before ``T``."""
        if self.t >= T:
            return
        # Hot path (most calls from the env): inside a planned decode stretch that T cuts.
        if (not self._plan_dirty and T <= self._st_t_last and self.G != self._g_ex and T <= self.fe_next
                and not self.prefilling and (self._blocked or not (self.sched.preempted_q or self.sched.waiting_q))):
            t0, a, c = self._st_t0, self._st_a, self._st_c
            G0 = self._st_G0
            if T - self.t > 8.0 * a:
                k = iterations_before(t0, a, c, T)
                t = t0 + k * a + c * k * (k - 1) / 2
            else:   # a few iterations: step k up (same closed form, so same numbers)
                k = self.G - G0 + 1
                t = t0 + k * a + c * k * (k - 1) / 2
                while t < T:
                    k += 1
                    t = t0 + k * a + c * k * (k - 1) / 2
            if self.gap_log is not None:
                self._log_gaps(a, c, self.G - G0, k, self.B)
            self.n_iterations += G0 + k - self.G
            self.G = G0 + k
            self.t = t
            return
        while self.t < T:
            if self.fe_next <= self.t:
                self._fe_release()
            if self.pend_n:
                self._hidden_step()
                continue
            if self._admit_step():
                continue
            if not self.B:
                if self.fe_count:   # nothing to run until the frontend hands a request on
                    if self.fe_next >= T:
                        return
                    if self.fe_next > self.t:
                        self.t = self.fe_next
                    continue
                assert not self.prefilling and (self._blocked or self.idle()), "engine stalled"
                if not self.idle():
                    raise RuntimeError(
                        f"instance {self.index}: waiting requests can never be admitted on an "
                        f"empty instance (they should have been rejected at arrival)")
                return
            self._decode(T if T <= self.fe_next else self.fe_next)

    def _hidden_step(self) -> None:
        """Async scheduling: run the iteration at the clock without the ``pend_n`` requests that
        joined the waiting queue since the previous iteration was scheduled (it was scheduled
        while that one ran, vLLM's one step ahead), then let them in for the next. If nothing
        else can run they go at once: an idle scheduler takes a new request straight away."""
        q = self.sched.waiting_q
        cut = len(q) - self.pend_n
        self.pend_n = 0
        tail = q[cut:]
        del q[cut:]
        if not self._admit_step() and self.B:
            self._decode(math.nextafter(self.t, INF))   # exactly the decode iteration at the clock
        self.sched.waiting_q.extend(tail)   # (admission may have replaced the list)
        self._blocked = False

    def _admit_step(self) -> bool:
        """Run the prefill (or, chunked, mixed) iteration at the clock if the queues give one;
        False when the next iteration is a decode or there is nothing to run."""
        if self.chunked:
            if self.prefilling or ((self.sched.preempted_q or self.sched.waiting_q) and not self._blocked):
                return self._mixed_iteration()
        elif (self.sched.preempted_q or self.sched.waiting_q) and not self._blocked:
            admitted = self._select()
            if admitted:
                self._prefill_iteration(admitted)
                return True
            self._blocked = True
        return False

    def in_decode_stretch(self) -> bool:
        """Whether the next iterations are the planned decode stretch (``_plan``): no prefill
        to run, nothing admissible, and the iteration at the clock does not run out of blocks.
        Inside it nothing finishes before ``_st_t_last`` and the membership is fixed, so the
        clock may be stepped in closed form (``advance_to``'s hot path, ``penalty.py``)."""
        return (not self._plan_dirty and self.G != self._g_ex and not self.prefilling and self.fe_next == INF
                and (self._blocked or not (self.sched.preempted_q or self.sched.waiting_q)))

    def jump_in_stretch(self, G: int, t: float) -> None:
        """Move the clock to decode iteration ``G`` of the planned stretch, starting at ``t``
        (``t = _st_t0 + k a + c k (k - 1) / 2`` with ``k = G - _st_G0``; ``penalty.py``)."""
        if self.gap_log is not None:
            self._log_gaps(self._st_a, self._st_c, self.G - self._st_G0, G - self._st_G0, self.B)
        self.n_iterations += G - self.G
        self.G = G
        self.t = t

    def _fe_flush(self) -> None:
        """Report the planned stretch's decode iterations run since the last report (iterations
        ``_fe_G .. G - 1``, each giving the B running requests a token) to the frontend's output
        stream. Called before anything changes the stretch or the running set, and by the
        frontend before it advances: one report per stretch and advance, not per clock move."""
        G = self.G
        if G > self._fe_G:
            G0 = self._st_G0
            assert self._fe_G >= G0, "output stream: unreported iterations from before the stretch"
            self.fe.stream(self._st_t0, self._st_a, self._st_c, self._fe_G - G0, G - G0, self.B)
            self._fe_G = G

    def record_token_gaps(self) -> None:
        """Keep every decode iteration's duration and token count from now on (``gap_log``;
        ``calibration/replay.token_gaps`` expands it):
        the inter-token latencies a streaming client measures (``vllm bench serve``'s ITL),
        which the per-request mean TBT hides. Off by default: the env's step path stays lean."""
        self.gap_log = []

    def _log_gaps(self, a: float, c: float, j0: int, j1: int, n: int) -> None:
        if j1 <= j0 or n <= 0:
            return
        if self._gap_stall > 0.0:   # the first decode after prefill-only iterations (no chunking)
            m = min(self._gap_stall_n, n)
            if m:
                self.gap_log.append((a + c * j0 + self._gap_stall, 0.0, 0, 1, m))
            if n > m:
                self.gap_log.append((a + c * j0, 0.0, 0, 1, n - m))
            self._gap_stall = 0.0
            self._gap_stall_n = 0
            j0 += 1
            if j1 <= j0:
                return
        self.gap_log.append((a, c, j0, j1, n))

    # ---------------------------------------------------------------- estimates
    def penalty(self) -> float:
        """Sum over requests on this instance of inv_ideal * (1 - min(generated/predicted, 1))
        (``progress.py``), or, with ``count_mode``, the number of requests on it (waiting,
        prefilling, running): the integrand of total latency (Little's law)."""
        if self.count_mode:
            return float(len(self.sched.preempted_q) + len(self.sched.waiting_q) + len(self.prefilling)
                         + self.B + self.fe_count)
        return self.progress.penalty(self.G)

    def decode_tokens_left(self) -> float:
        """Predicted decode tokens still to generate (clipped at 0 per request)."""
        return self.progress.decode_tokens_left(self.G)

    def decode_iteration_s(self) -> float:
        """Duration of a decode iteration of the current running batch."""
        if not self.B:
            return 0.0
        return self.timing.decode_s(self.B, self.S_at + self.B * (self.G - self.G_S))

    def earliest_completion_s(self) -> float:
        """Predicted time until the first running request completes (0 when none runs)."""
        if not self.B:
            return 0.0
        pg = self.progress
        pg.pop_saturated(self.G)
        if pg.n_sat_running or not pg.sat_heap:
            return 0.0
        return max(pg.sat_heap[0][0] - self.G, 0) * self.decode_iteration_s()

    def observe_into(self, out: list, kv_tokens: float) -> None:
        """Append this instance's router features to ``out``: prompt-phase bucket counts,
        decode-phase bucket counts, capacity ``1 - committed / kv_tokens`` (clipped at -1) and
        the earliest predicted completion. One call per instance per env step, so it lives
        here, where the compiled build runs it without interpreter overhead."""
        out += self.prompt_counts
        out += self.decode_counts
        cap = 1.0 - self.committed_tokens / kv_tokens
        out.append(cap if cap > -1.0 else -1.0)
        out.append(self.earliest_completion_s() if self.B else 0.0)

    # ------------------------------------------------------------ state changes
    def _enter_prompt_phase(self, rid: int) -> None:
        tb = self.table
        self.prompt_counts[tb.prompt_bucket[rid]] += 1
        self.pending_prefill_tokens += tb.prompt[rid] + tb.o_base[rid]
        self.progress.enter_prompt(rid)

    def _leave_prompt_phase(self, rid: int) -> None:
        self.prompt_counts[self.table.prompt_bucket[rid]] -= 1
        self.progress.leave_prompt(rid)

    def _rebase_S(self) -> None:
        self.S_at += self.B * (self.G - self.G_S)
        self.G_S = self.G

    def _join_running(self, rid: int, o: int) -> None:
        """Request ``rid`` has generated ``o`` tokens and decodes from iteration G on."""
        if self.fe_out:
            self._fe_flush()
        tb, G = self.table, self.G
        self._rebase_S()
        self._sync_used()
        tb.status[rid] = _RUNNING
        tb.o_base[rid] = o
        tb.g_base[rid] = G
        seq = self.admit_counter
        self.admit_counter += 1
        tb.admit_seq[rid] = seq
        self.running[rid] = None
        self.B += 1
        p = tb.prompt[rid]
        self.S_at += p + o
        self.phase_cnt[(G + 1 - p - o) % self.kv.bs] += 1
        heapq.heappush(self.fin_heap, (G + tb.decode[rid] - 1 - o, seq, rid))
        self.decode_counts[tb.decode_bucket[rid]] += 1
        self.progress.join_running(rid, o, G, seq)
        self._plan_dirty = True

    def _leave_running(self, rid: int) -> int:
        """Remove ``rid`` from the running set at the current G; return its generated tokens."""
        if self.fe_out:
            self._fe_flush()
        tb, G = self.table, self.G
        self._rebase_S()
        self._sync_used()
        o = tb.o_base[rid] + G - tb.g_base[rid]
        p = tb.prompt[rid]
        del self.running[rid]
        self.B -= 1
        self.S_at -= p + o
        self.phase_cnt[(tb.g_base[rid] + 1 - p - tb.o_base[rid]) % self.kv.bs] -= 1
        self.decode_counts[tb.decode_bucket[rid]] -= 1
        self.progress.leave_running(rid, self.B)
        self._plan_dirty = True
        self._blocked = False
        return o

    def _finish(self, rid: int, o: int, now: float) -> None:
        tb = self.table
        assert o == tb.decode[rid], "finished with a wrong token count"
        self.kv.drop(rid, o)
        tb.status[rid] = _FINISHED
        tb.finish_s[rid] = now
        tb.o_base[rid] = o
        self.committed_tokens -= tb.prompt[rid] + tb.pred[rid]
        self.n_finished += 1
        if tb.count_slo and tb.meets_slo(rid):
            self.n_slo_met += 1
        if self.fe is not None:
            self.fe.finished(rid, now)
        self._blocked = False
        if self.idle():   # nobody left: drop the float residue, so an idle penalty is exactly 0
            self.progress.clear()

    def abort(self, rid: int, now: float) -> bool:
        """Drop request ``rid`` at ``now`` (after ``advance_to(now)``): its client went away.

        Why: a server that keeps generating for a gone client holds a batch slot and KV blocks
        that waiting requests need (vLLM aborts such a request at its next step; the simulated
        backend, ``serve/sim_backend.py``, does the same through this). A waiting request leaves
        the queue; a running one leaves the batch after the iterations already run (its tokens
        so far are kept) and frees its blocks. It ends FINISHED with ``decode`` set to the tokens
        it got, so every conservation check still holds. A request in the middle of a chunked
        prefill cannot be dropped between chunks here (its partial blocks are not tracked per
        request): returns False and the caller retries once it runs; True when dropped."""
        tb = self.table
        st = tb.status[rid]
        if st == _WAITING:
            if rid in self.sched.preempted_q:
                self.sched.preempted_q.remove(rid)
            elif rid in self.sched.waiting_q:
                q = self.sched.waiting_q
                if q.index(rid) >= len(q) - self.pend_n:   # joined since the last schedule
                    self.pend_n -= 1
                q.remove(rid)
            else:   # still in the frontend's input stage
                self.fe.cancel(rid)
                self.fe_count -= 1
            self._leave_prompt_phase(rid)
            self.pending_prefill_tokens -= tb.prompt[rid] + tb.o_base[rid]
            o = tb.o_base[rid]
        elif st == _RUNNING:
            o = self._leave_running(rid)
            self.kv.drop(rid, o)
        else:
            return False
        tb.status[rid] = _FINISHED
        tb.finish_s[rid] = now
        tb.o_base[rid] = o
        tb.decode[rid] = o
        self.committed_tokens -= tb.prompt[rid] + tb.pred[rid]
        self._blocked = False
        self._plan_dirty = True
        if self.idle():
            self.progress.clear()
        return True

    def _preempt(self, rid: int) -> None:
        """Recompute preemption: free the blocks, keep the tokens, requeue at the front."""
        tb = self.table
        o = self._leave_running(rid)
        self.kv.drop(rid, o)
        tb.o_base[rid] = o
        tb.status[rid] = _WAITING
        tb.preemptions[rid] += 1
        self.n_preemptions += 1
        self.sched.preempted_q.append(rid)
        self._enter_prompt_phase(rid)

    # ------------------------------------------------------------- admission
    def _select(self, budget: int | None = None) -> list[int]:
        """Admit from the waiting queue (``scheduler.py``; the semantics doc); returns admitted
        ids. ``budget``: the chunked iteration's tokens left (None without chunking)."""
        self._sync_used()
        out = self.sched.select(self.B + len(self.prefilling), budget)
        if out and self.kv.pc:   # the cached part of their prompts needs no prefill
            tb = self.table
            for r in out:
                self.pending_prefill_tokens -= tb.cached_tokens[r]
        return out

    def cached_prefix_tokens(self, rid: int) -> int:
        """Prompt tokens of request ``rid`` that this instance would reuse if it admitted it
        now (0 without prefix caching): what a router with engine introspection reads."""
        if not self.kv.pc or self.table.hashes[rid] is None:
            return 0
        self._sync_used()   # evictions due to decode growth happen lazily
        tb = self.table
        return self.kv.hit_units(rid, tb.prompt[rid] + tb.o_base[rid]) * self.kv.H

    def _start(self, rid: int, s: float) -> None:
        tb = self.table
        if tb.first_scheduled_s[rid] != tb.first_scheduled_s[rid]:   # NaN: first admission
            tb.first_scheduled_s[rid] = s
        tb.status[rid] = _PREFILLING

    def _complete_prefill(self, rid: int, end: float) -> None:
        """The prefill of ``rid`` finished at ``end``: it emits one token."""
        tb = self.table
        self._leave_prompt_phase(rid)
        if self.kv.pc:
            self.kv.register(rid)
            if not self.chunked:   # the cached part was settled at admission
                self.pending_prefill_tokens -= tb.prompt[rid] + tb.o_base[rid] - tb.cached_tokens[rid]
        elif not self.chunked:   # chunked iterations settle it chunk by chunk
            self.pending_prefill_tokens -= tb.prompt[rid] + tb.o_base[rid]
        o = tb.o_base[rid] + 1
        if tb.first_token_s[rid] != tb.first_token_s[rid]:
            tb.first_token_s[rid] = end
            if self.fe is not None:
                self.fe.first_token(rid, end)
        if o >= tb.decode[rid]:
            self._finish(rid, o, end)
        else:
            self._join_running(rid, o)

    def _prefill_iteration(self, admitted: list[int]) -> None:
        if self.fe_out:
            self._fe_flush()
        tb, s = self.table, self.t
        toks = pairs = 0
        for r in admitted:
            L = tb.prompt[r] + tb.o_base[r]
            if self.kv.pc:   # only the uncached suffix is computed; its attention spans the prefix
                q = tb.cached_tokens[r]
                toks += L - q
                pairs += (L - q) * q + (L - q) * (L - q + 1) // 2   # causal pairs after q cached
            else:
                toks += L
                pairs += L * (L + 1) // 2   # causal: a whole prompt, nothing cached
            self._start(r, s)
        end = s + self.timing.span(self.timing.batch_s(toks, pairs, len(admitted)), len(admitted))
        if self.gap_log is not None and self.B:   # the running requests wait through it
            self._gap_stall += end - s
            self._gap_stall_n = max(self._gap_stall_n, self.B)
        self.t = end
        self._plan_dirty = True   # the clock moved under any decode stretch
        self.n_iterations += 1
        self.n_prefill_iterations += 1
        for r in admitted:
            self._complete_prefill(r, end)
        if self.check:
            self._check()

    def _grow_blocks(self) -> None:
        """Give each running request that needs a block at this iteration one, preempting the
        most recently admitted running request while none is free."""
        self._sync_used()
        kv = self.kv
        ph = self.G % kv.bs
        if not self.phase_cnt[ph]:
            return
        tb, bs = self.table, kv.bs
        for r in list(self.running):
            if r not in self.running or (tb.g_base[r] + 1 - tb.prompt[r] - tb.o_base[r]) % bs != ph:
                continue
            while kv.used >= kv.total_blocks:
                if self.chunk_alloc and self._steal_block(0):
                    continue
                victim = next(reversed(self.running))
                self._preempt(victim)
                if victim == r:
                    break
            if r in self.running:
                kv.add_block()
        kv.note_peak()

    def _steal_block(self, first: int) -> bool:
        """``kv_allocation=chunk``: take the last block of the most recently admitted prefilling
        request at index ``first`` or later of ``prefilling`` that holds one beyond its cached
        prefix; its computed tokens fall back to the block boundary (they will be computed
        again). vLLM V1 preempts that request, but its computed blocks stay in the prefix cache
        (its default) and its readmission finds all but the ones taken. False: none to take."""
        tb, kv, bs = self.table, self.kv, self.kv.bs
        pf = self.prefilling
        for j in range(len(pf) - 1, first - 1, -1):
            r = pf[j]
            done = tb.prefill_done[r]
            held = -(-done // bs)
            if held > (kv.hb * tb.kv_refs[r] if kv.pc else 0):
                tb.prefill_done[r] = (held - 1) * bs
                self.pending_prefill_tokens += done - (held - 1) * bs
                kv.used -= 1
                return True
        return False

    def _chunk_blocks(self, i: int, k: int) -> bool:
        """``kv_allocation=chunk``: give ``prefilling[i]`` the ``k`` blocks its next chunk needs,
        taking them from prefilling requests admitted after it when none are free; False (and
        nothing taken) if it cannot have them all: vLLM allocates a chunk's slots all or none."""
        kv = self.kv
        self._sync_used()
        while kv.total_blocks - kv.used < k:
            if not self._steal_block(i + 1):
                return False
        kv.grow(k)
        return True

    def _end_decode(self) -> None:
        """Finish the requests whose last token came from the iterations just run."""
        h, tb, G, now = self.fin_heap, self.table, self.G, self.t
        while h and h[0][0] < G:
            _, seq, rid = heapq.heappop(h)
            if tb.admit_seq[rid] != seq or tb.status[rid] != _RUNNING:
                continue   # stale: the request was preempted since
            o = self._leave_running(rid)
            self._finish(rid, o, now)

    def _mixed_iteration(self) -> bool:
        """One chunked-prefill iteration: decodes, partial prefills, new admissions."""
        if self.fe_out:
            self._fe_flush()
        tb, s = self.table, self.t
        if self.B:
            self._grow_blocks()
        budget = self.sched.budget - self.B
        toks = pairs = nchunks = 0
        completed: list[int] = []
        stalled = False
        bs = self.kv.bs
        for i in range(len(self.prefilling)):
            if budget <= 0:
                break
            r = self.prefilling[i]
            L, done = tb.prompt[r] + tb.o_base[r], tb.prefill_done[r]
            c = min(L - done, budget)
            if self.chunk_alloc:
                k = -(-(done + c) // bs) - -(-done // bs)
                if k and not self._chunk_blocks(i, k):
                    # vLLM V1 preempts it (or one admitted later), and admits nothing this step
                    stalled = True
                    break
            nchunks += 1
            toks += c
            pairs += c * done + c * (c + 1) // 2   # causal pairs of a chunk after ``done`` cached
            tb.prefill_done[r] = done + c
            self.pending_prefill_tokens -= c
            budget -= c
            if done + c == L:
                completed.append(r)
        new = (self._select(budget) if budget > 0 and not stalled and (self.sched.preempted_q or self.sched.waiting_q)
               else [])
        if not new and not self.prefilling and (self.sched.preempted_q or self.sched.waiting_q):
            # Nothing can be admitted until a completion or preemption frees room. (While
            # prefills are in flight their chunks take budget, so admission is retried.)
            self._blocked = True
        nchunks += len(new)
        for r in new:
            self._start(r, s)
            L = tb.prompt[r] + tb.o_base[r]
            q = tb.cached_tokens[r] if self.kv.pc else 0   # cached prefix: computed already
            c = min(L - q, budget)
            toks += c
            pairs += c * q + c * (c + 1) // 2   # causal pairs of a chunk after q cached
            budget -= c
            tb.prefill_done[r] = q + c
            self.pending_prefill_tokens -= c
            self.prefilling.append(r)
            if q + c == L:
                completed.append(r)
        if not self.B and not toks:
            assert not stalled, (f"instance {self.index}: every prefill waits for KV blocks that only "
                                 "another prefill's cached prefix holds")
            return False
        B = self.B
        dur = self.timing.batch_s(toks + B, pairs, nchunks + B)
        if B:   # the decode sequences' own terms (batch_s counted their tokens)
            dur += self.timing.cds * B + self.timing.dec_c[B] * (self.S_at + B * (self.G - self.G_S))
        dur = self.timing.span(dur, nchunks + B)
        self.t = s + dur
        self.n_iterations += 1
        self._plan_dirty = True
        if self.B:
            if self.gap_log is not None:
                self._log_gaps(dur, 0.0, 0, 1, self.B)
            if self.fe_out:
                self.fe.stream(s, dur, 0.0, 0, 1, self.B)
                self._fe_G = self.G + 1
            self.G += 1
            self._used_G = self.G   # this iteration's blocks were allocated explicitly
            self._end_decode()
        if completed:
            done_set = set(completed)
            self.prefilling = [r for r in self.prefilling if r not in done_set]
            for r in completed:
                tb.prefill_done[r] = 0
                self._complete_prefill(r, self.t)
        if self.check:
            self._check()
        return True

    # --------------------------------------------------------------- decoding
    def _demand(self, G: int, k: int) -> int:
        """New blocks the running set needs in iterations G .. G+k-1."""
        full, rem = divmod(k, self.kv.bs)
        d = full * self.B
        cnt, bs = self.phase_cnt, self.kv.bs
        for i in range(rem):
            d += cnt[(G + i) % bs]
        return d

    def _plan(self) -> None:
        """Start a decode stretch at the current (G, t): it runs until the first completion,
        the first iteration whose block demand exceeds the free blocks, or (reference mode)
        one iteration. Iteration j of the stretch starts at t0 + j a + c j (j - 1) / 2."""
        if self.fe_out:   # the previous stretch's iterations, before its parameters go
            self._fe_flush()
        h, tb = self.fin_heap, self.table
        while h and (tb.admit_seq[h[0][2]] != h[0][1] or tb.status[h[0][2]] != _RUNNING):
            heapq.heappop(h)
        G = self.G
        self._g_fin_end = h[0][0] + 1 if h else INF
        self._sync_used()
        kv = self.kv
        free, B, bs = kv.total_blocks - kv.used, self.B, kv.bs
        if kv.ev_blocks and self.chunk_alloc and kv.pc and (self.sched.preempted_q or self.sched.waiting_q):
            # Growth that evicts a cached block can let a waiting request in: with per-chunk
            # allocation its first chunk spans its cached prefix plus the budget, so once that
            # prefix is evicted the chunk needs fewer blocks (the reference retries admission
            # every iteration). The iteration that first evicts runs explicitly (_decode: a mixed
            # iteration, which retries admission after growth).
            free -= kv.ev_blocks
        span = self._g_fin_end - G
        if B * -(-span // bs) <= free:
            self._g_ex = INF
        else:
            cycles, r = divmod(free, B)
            g = G + cycles * bs
            cum, cnt = 0, self.phase_cnt
            for i in range(bs):
                cum += cnt[(g + i) % bs]
                if cum > r:
                    break
            self._g_ex = g + i
        stop = min(self._g_fin_end, self._g_ex)
        if not self.fast:
            stop = min(stop, G + 1)
        self._st_G0 = G
        self._st_t0 = t0 = self.t
        tm = self.timing
        cdc = tm.dec_c[B]
        a = tm.dec_a[B] + cdc * (self.S_at + B * (G - self.G_S))
        c = cdc * B
        if tm.overlap:   # async scheduling: an iteration lasts max(GPU side, CPU step)
            cpu = tm.cpu_floor(B)
            if a < cpu:   # CPU-bound until the growing context makes the GPU side longer
                if c > 0.0:
                    j = math.ceil((cpu - a) / c)
                    while j > 1 and a + c * (j - 1) >= cpu:   # float safety: the first j with a + c j >= cpu
                        j -= 1
                    while a + c * j < cpu:
                        j += 1
                    stop = min(stop, G + j)
                a, c = cpu, 0.0
        self._st_a = a
        self._st_c = c
        n = stop - G
        self._st_n = n
        # Start time of the stretch's last iteration: T beyond it lets the whole stretch run.
        self._st_t_last = INF if n == INF else t0 + (n - 1) * a + c * (n - 1) * (n - 2) / 2
        self._plan_dirty = False

    def _decode(self, T: float) -> None:
        if self._plan_dirty:
            self._plan()
        if self.G == self._g_ex:   # this iteration runs out of blocks: walk it explicitly
            if self.fe_out:
                self._fe_flush()
            if self.chunked:   # preemption frees blocks that the same iteration may admit into
                self._mixed_iteration()
                return
            self._grow_blocks()
            if self.B:
                G = self.G
                dur = self.timing.decode_s(self.B, self.S_at + self.B * (G - self.G_S))
                if self.gap_log is not None:
                    self._log_gaps(dur, 0.0, 0, 1, self.B)
                if self.fe_out:
                    self.fe.stream(self.t, dur, 0.0, 0, 1, self.B)
                    self._fe_G = G + 1
                self.t += dur
                self.G = G + 1
                self._used_G = self.G
                self.n_iterations += 1
                self._end_decode()
            self._plan_dirty = True
            if self.check:
                self._check()
            return
        t0, a, c = self._st_t0, self._st_a, self._st_c
        if T <= self._st_t_last:   # the stretch is cut by T: run what starts before T
            k = iterations_before(t0, a, c, T)
            if self.gap_log is not None:
                self._log_gaps(a, c, self.G - self._st_G0, k, self.B)
            self.n_iterations += self._st_G0 + k - self.G
            self.G = self._st_G0 + k
            self.t = t0 + k * a + c * k * (k - 1) / 2
            return
        n = int(self._st_n)   # finite: T is past the stretch's last iteration
        if self.gap_log is not None:
            self._log_gaps(a, c, self.G - self._st_G0, n, self.B)
        self.n_iterations += self._st_G0 + n - self.G
        self.G = self._st_G0 + n
        self.t = t0 + n * a + c * n * (n - 1) / 2
        self._plan_dirty = True
        if self.G == self._g_fin_end:
            self._end_decode()
        if self.check:
            self._check()

    # ------------------------------------------------------------- invariants
    def _check(self) -> None:
        """Recompute the aggregates from scratch and compare (tests only)."""
        self._sync_used()
        kv = self.kv
        tb, bs, G = self.table, kv.bs, self.G
        held = 0
        S = 0
        for r in self.running:
            o = tb.o_base[r] + G - tb.g_base[r]
            assert 1 <= o < tb.decode[r], (r, o)
            held += -(-(tb.prompt[r] + o - 1) // bs)
            S += tb.prompt[r] + o
        for r in self.prefilling:   # reserved for the whole prefill, or (chunk) what is computed
            held += -(-(tb.prefill_done[r] if self.chunk_alloc else tb.prompt[r] + tb.o_base[r]) // bs)
        if kv.pc:   # minus the blocks that sharing saves
            held += kv.check(chain(self.running, self.prefilling),
                             chain(self.sched.preempted_q, self.sched.waiting_q))
        assert held == kv.used, f"instance {self.index}: blocks {kv.used} != {held}"
        assert 0 <= kv.used <= kv.total_blocks
        assert S == self.S_at + self.B * (G - self.G_S)
        assert self.B == len(self.running) <= self.sched.max_seqs
        assert self.B + len(self.prefilling) <= self.sched.max_seqs


def advance_all(engines: list, T: float) -> None:
    """``Cluster.advance_to``'s pass over its instances (each one behind ``T`` runs to it): a
    module function so that the compiled build runs this loop in C (``penalty.py``'s passes
    likewise)."""
    for e in engines:
        if e.t < T:
            e.advance_to(T)
