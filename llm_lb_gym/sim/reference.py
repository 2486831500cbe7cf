"""Naive step-by-step reference simulator of one instance: the oracle for the fast engine.

Why it exists: ``engine.py`` advances stretches of decode iterations in closed form and keeps
aggregates instead of per-request state, which is fast and easy to get subtly wrong. This module
follows ``docs/simulator_semantics.md`` literally, one iteration at a time, with one Python object
per request and explicit block counts, so that it can be checked by reading. Nothing here is
optimised; do not use it inside the environment.

Readings of the contract where its text leaves room (kept in one place so that the fast engine
can be held to the same ones):

- Preemption victims are chosen from the *running* set (requests whose prefill has completed).
  In chunked mode a request still prefilling is not running and is never a victim, so a decode
  may preempt itself while prefilling requests keep their blocks.
- In chunked mode the admission checks are the sequence limit and the watermark; the token check
  of the non-chunked mode is replaced by "budget left > 0", the chunk being min(p + o, budget left).
- ``bin_packing`` skips any request that does not fit, preempted ones included.
- A prefilling request holds blocks for its whole ``p + o`` from admission, although its KV is
  written chunk by chunk; the block check counts what is held. With ``kv_allocation=chunk``
  (vLLM V1) it holds blocks for the tokens computed so far: admission allocates the first
  chunk's, each later chunk its own (all or none: a chunk that cannot have its blocks, after
  taking those of prefills admitted later, waits, and nothing is admitted in that iteration),
  and a decode short of a block takes the last block of the most recently admitted prefill
  holding one beyond its cached prefix (that prefill's computed tokens fall back to the block
  boundary) before it preempts a running request.

Prefix caching (``enable_prefix_caching``, docs/prefix_caching.md) is kept literal too: a dict
of cached hash blocks with reference counts and a plain list as the LRU order of the evictable
ones, admissions applied one at a time, evictions done at the allocation that needs them.

The frontend (``engine.frontend``, ``frontend.py``) is restated literally as well: every job
keeps its remaining work, which each job in service loses at ``r / n`` per second, ``r`` the
share of the CPU the streamed tokens leave (``output_stream.py``: during each decode iteration
of duration ``tau`` with ``n`` tokens, ``r = max(0, 1 - output_token_s n / tau)``, else 1; with
``input_workers`` > 0, input jobs beyond that many wait in a list, in arrival order); a request
joins the waiting queue (at the back, in the order its input work ends) at the first iteration
start at or after its input job completes.

Async scheduling (``engine.async_scheduling``): an iteration lasts the longer of its GPU side and
its CPU step, and the requests that join the waiting queue at an iteration's start are left out
of that iteration (it was scheduled when the previous one started) unless nothing else can run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .batching import get_policy
from .config import EngineConfig
from .latency import causal_pairs


@dataclass
class RefRequest:
    """A request as routed to the instance."""

    rid: int
    route_s: float
    """Time it joins the instance's waiting queue."""
    prompt_tokens: int
    decode_tokens: int
    """True output length d (tokens generated, the first by the prefill)."""
    pred_decode_tokens: float
    """Predicted output length; only the least_work_left scheduler reads it."""
    prefix_hashes: tuple | None = None
    """Chained hash ids of the prompt's blocks of ``hash_block_tokens`` (prefix caching)."""


@dataclass
class RefResult:
    """Timestamps of one request; same order as the input list."""

    rid: int
    first_scheduled_s: float
    first_token_s: float
    finish_s: float
    preemptions: int
    seen_first_token_s: float | None = None
    """With a frontend: the first token as the client sees it (after the first chunk's work)."""
    seen_finish_s: float | None = None
    """With a frontend: the end of the response as the client sees it."""


@dataclass
class RefStats:
    """Whole-run counters, for tests that check conservation and capacity."""

    iterations: int
    preemptions: int
    peak_blocks: int
    end_s: float
    """End of the last iteration (the finish of the last request)."""
    prefix_tokens: tuple = (0, 0, 0, 0)
    """Prefix caching: (prompt tokens, cached tokens) of first admissions, then of readmissions."""


class _Seq:
    """Mutable state of one request inside the reference simulation."""

    def __init__(self, req: RefRequest, queue_index: int):
        self.req = req
        self.queue_index = queue_index  # route order, the tie-breaker of every scheduler
        self.p = req.prompt_tokens
        self.d = req.decode_tokens
        self.o = 0
        self.blocks = 0
        self.state = "future"  # future, waiting, prefilling, running, finished
        self.admitted_at = -1  # admission counter of the latest admission
        self.prefill_len = 0  # p + o at the latest admission
        self.prefill_done = 0  # tokens of that prefill already computed (chunked mode)
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.seen_first_token_s: float | None = None
        self.seen_finish_s: float | None = None
        self.preemptions = 0
        self.hashes = req.prefix_hashes
        self.refs: list = []  # hash ids of the cached blocks it references (a prefix of hashes)
        self.cached = 0  # prompt tokens reused at the latest admission


class _Instance:
    """One engine: waiting queues, running set, block pool, clock."""

    def __init__(self, cfg: EngineConfig, hash_block_tokens: int = 0):
        self.cfg = cfg
        self.frontend = _RefFrontend(cfg.frontend_model) if cfg.frontend_model is not None else None
        self.decoded = 0   # the requests that got a decode token in the last iteration
        # Prefix caching: hash id -> reference count; ``lru`` = evictable ids, oldest first.
        self.H = hash_block_tokens if cfg.enable_prefix_caching else 0
        self.hb = self.H // cfg.block_size
        self.cache: dict = {}
        self.lru: list = []
        self.counts = [0, 0, 0, 0]
        self.bs = cfg.block_size
        self.total = cfg.total_blocks
        self.wm = cfg.watermark_blocks
        self.chunk_alloc = cfg.kv_allocation == "chunk"
        self.lat = cfg.latency_model
        self.policy = get_policy(cfg.scheduler)
        self.used = 0
        self.peak = 0
        self.preempted: list[_Seq] = []  # front of the waiting queue, in preemption order
        self.fresh: list[_Seq] = []  # never-run requests, in route order
        self.prefilling: list[_Seq] = []
        self.running: list[_Seq] = []
        self.admissions = 0
        self.iterations = 0
        self.preemption_count = 0

    # ---- blocks -----------------------------------------------------------------------------
    def free_blocks(self) -> int:
        return self.total - self.used

    def allocate(self, seq: _Seq, n: int) -> None:
        assert n <= self.free_blocks(), f"allocating {n} blocks with {self.free_blocks()} free"
        seq.blocks += n
        self.used += n
        # No empty block left: evict least recently used cached blocks.
        while self.used + self.hb * len(self.lru) > self.total:
            del self.cache[self.lru.pop(0)]
        self.peak = max(self.peak, self.used)

    def release(self, seq: _Seq) -> None:
        self.used -= seq.blocks
        seq.blocks = 0
        for h in reversed(seq.refs):  # tail first into the LRU order
            self.cache[h] -= 1
            if self.cache[h] == 0:
                self.lru.append(h)
                self.used -= self.hb
        seq.refs = []
        assert self.used >= 0

    # ---- prefix caching ---------------------------------------------------------------------
    def hit_blocks(self, seq: _Seq) -> int:
        """Leading full hash blocks cached, leaving at least one token to compute."""
        if not self.H or seq.hashes is None:
            return 0
        limit = min(len(seq.hashes), seq.p // self.H, (seq.p + seq.o - 1) // self.H)
        n = 0
        while n < limit and seq.hashes[n] in self.cache:
            n += 1
        return n

    def take_cached(self, seq: _Seq, n: int) -> None:
        for h in seq.hashes[:n]:
            if self.cache[h] == 0:
                self.lru.remove(h)
                self.used += self.hb
            self.cache[h] += 1
        seq.refs = list(seq.hashes[:n])
        seq.cached = n * self.H
        k = 2 if seq.preemptions else 0
        self.counts[k] += seq.p + seq.o
        self.counts[k + 1] += seq.cached

    def register(self, seq: _Seq) -> None:
        """Prefill computed: its full prompt blocks become cached (merged with a cached copy)."""
        if not self.H or seq.hashes is None:
            return
        for h in seq.hashes[len(seq.refs):min(len(seq.hashes), seq.p // self.H)]:
            seq.blocks -= self.hb
            if h not in self.cache:
                self.cache[h] = 1
            else:
                if self.cache[h] == 0:
                    self.lru.remove(h)
                else:
                    self.used -= self.hb
                self.cache[h] += 1
            seq.refs.append(h)

    # ---- queue order ------------------------------------------------------------------------
    def scheduler_order(self) -> list[_Seq]:
        """Preempted first (preemption order), then never-run requests in scheduler order."""
        fresh = sorted(self.fresh, key=lambda s: s.queue_index)
        key = self.policy.key
        if key is not None:   # stable sort: ties keep queue order
            fresh = sorted(fresh, key=lambda s: key(s.p, s.o, s.req.pred_decode_tokens))
        return list(self.preempted) + fresh

    def first_blocks(self, seq: _Seq, n: int, budget_left: int | None) -> int:
        """Blocks an admission allocates beside its ``n`` cached hash blocks: the whole
        ``p + o``, or (chunk allocation) the first chunk's."""
        L = seq.p + seq.o
        if self.chunk_alloc and budget_left is not None:
            L = min(L, n * self.H + budget_left)
        return math.ceil(L / self.bs) - self.hb * n

    def admit(self, seq: _Seq, now: float, budget_left: int | None = None) -> None:
        if seq in self.preempted:
            self.preempted.remove(seq)
        else:
            self.fresh.remove(seq)
        n = self.hit_blocks(seq)
        if self.H:
            self.take_cached(seq, n)
        self.allocate(seq, self.first_blocks(seq, n, budget_left))
        self.admissions += 1
        seq.admitted_at = self.admissions
        seq.prefill_len = seq.p + seq.o
        seq.prefill_done = seq.cached if self.H else 0
        seq.state = "prefilling"
        if seq.first_scheduled_s is None:
            seq.first_scheduled_s = now

    def fits(self, seq: _Seq, seqs_so_far: int, blocks_so_far: int, budget_left: int | None = None) -> bool:
        """Sequence limit and watermark; the token check differs per mode and is done by callers."""
        n = self.hit_blocks(seq) if self.H else 0
        need = self.first_blocks(seq, n, budget_left) + self.hb * n
        if self.H:  # cached blocks need no new block, but evictable ones leave the free pool
            hits = seq.hashes[:n] if seq.hashes else []
            need -= self.hb * sum(1 for h in hits if self.cache[h] > 0)
        return (seqs_so_far < self.cfg.max_num_seqs
                and self.free_blocks() - blocks_so_far - need >= self.wm)

    # ---- token generation -------------------------------------------------------------------
    def emit_token(self, seq: _Seq, end: float) -> None:
        """One token at the end of an iteration; finishing frees the blocks."""
        seq.o += 1
        if seq.first_token_s is None:
            seq.first_token_s = end
            if self.frontend is not None:
                self.frontend.report(end, "first", seq)
        if seq.o == seq.d:
            seq.state = "finished"
            seq.finish_s = end
            self.release(seq)
            if seq in self.running:
                self.running.remove(seq)

    def finish_prefill(self, seq: _Seq, end: float) -> None:
        self.register(seq)
        self.prefilling.remove(seq)
        seq.state = "running"
        self.running.append(seq)
        self.emit_token(seq, end)

    # ---- decode block growth and preemption -------------------------------------------------
    def preempt(self, victim: _Seq) -> None:
        self.running.remove(victim)
        self.release(victim)
        victim.state = "waiting"
        victim.preemptions += 1
        self.preemption_count += 1
        self.preempted.append(victim)

    def steal_block(self, after: int) -> bool:
        """Chunk allocation: the most recently admitted prefilling request admitted after
        ``after`` that holds a block of its own gives up its last one; False if none does."""
        owners = [s for s in self.prefilling if s.admitted_at > after and s.blocks > 0]
        if not owners:
            return False
        seq = max(owners, key=lambda s: s.admitted_at)
        seq.blocks -= 1
        self.used -= 1
        seq.prefill_done = (math.ceil(seq.prefill_done / self.bs) - 1) * self.bs
        return True

    def grow_decodes(self) -> list[_Seq]:
        """Give every running request the block its next token needs; return those served."""
        served: list[_Seq] = []
        for seq in sorted(self.running, key=lambda s: s.admitted_at):
            if seq.state != "running":
                continue  # preempted earlier in this walk
            need = math.ceil((seq.p + seq.o) / self.bs) - seq.blocks - self.hb * len(seq.refs)
            assert need in (0, 1), f"request {seq.req.rid} needs {need} new blocks"
            while need == 1:
                if self.free_blocks() >= 1:
                    self.allocate(seq, 1)
                    need = 0
                elif self.chunk_alloc and self.steal_block(0):
                    continue
                else:
                    victim = max(self.running, key=lambda s: s.admitted_at)
                    assert victim not in served
                    self.preempt(victim)
                    if victim is seq:
                        break
            if seq.state == "running":
                served.append(seq)
        return served

    # ---- one iteration ----------------------------------------------------------------------
    def step_unchunked(self, now: float) -> float | None:
        """One iteration without chunking; returns its end time, or None if nothing ran."""
        admitted: list[_Seq] = []
        tokens = 0
        blocks = 0
        for seq in self.scheduler_order():
            seq_tokens = seq.p + seq.o
            if self.H:  # prefix caching: admit at once (the next lookup sees its evictions)
                if (self.fits(seq, len(self.running) + len(admitted), 0)
                        and tokens + seq_tokens - self.hit_blocks(seq) * self.H <= self.cfg.token_budget):
                    self.admit(seq, now)
                    self.prefilling.append(seq)
                    admitted.append(seq)
                    tokens += seq_tokens - seq.cached
                elif not self.policy.skip_unfit:
                    break
                continue
            ok = (self.fits(seq, len(self.running) + len(admitted), blocks)
                  and tokens + seq_tokens <= self.cfg.token_budget)
            if ok:
                admitted.append(seq)
                tokens += seq_tokens
                blocks += math.ceil(seq_tokens / self.bs)
            elif not self.policy.skip_unfit:
                break
        if admitted:
            if not self.H:
                for seq in admitted:
                    self.admit(seq, now)
                    self.prefilling.append(seq)
            dur = self.lat.iteration_s(
                prefill_tokens=sum(s.prefill_len - s.cached for s in admitted),
                prefill_attn_pairs=sum(causal_pairs(s.prefill_len - s.cached, s.cached) for s in admitted),
                prefill_seqs=len(admitted), overlap_cpu=self.cfg.async_scheduling)
            end = now + dur
            for seq in admitted:
                seq.prefill_done = seq.prefill_len
                self.finish_prefill(seq, end)
            return end
        if not self.running:
            return None
        decodes = self.grow_decodes()
        assert decodes, "a decode iteration lost every request to preemption"
        dur = self.lat.iteration_s(decode_seqs=len(decodes),
                                   decode_ctx_tokens=sum(s.p + s.o for s in decodes),
                                   overlap_cpu=self.cfg.async_scheduling)
        end = now + dur
        self.decoded = len(decodes)
        for seq in decodes:
            self.emit_token(seq, end)
        return end

    def step_chunked(self, now: float) -> float | None:
        """One mixed iteration under the token budget; returns its end time, or None if idle."""
        decodes = self.grow_decodes()
        budget_left = self.cfg.token_budget - len(decodes)
        assert budget_left >= 0
        chunks: list[tuple[_Seq, int, int]] = []  # (request, chunk tokens, tokens done before)
        stalled = False
        for seq in sorted(self.prefilling, key=lambda s: s.admitted_at):
            chunk = min(seq.prefill_len - seq.prefill_done, budget_left)
            if chunk > 0:
                if self.chunk_alloc:   # this chunk's blocks, all or none
                    need = math.ceil((seq.prefill_done + chunk) / self.bs) - math.ceil(seq.prefill_done / self.bs)
                    while self.free_blocks() < need and self.steal_block(seq.admitted_at):
                        pass
                    if self.free_blocks() < need:
                        stalled = True
                        break
                    self.allocate(seq, need)
                chunks.append((seq, chunk, seq.prefill_done))
                budget_left -= chunk
        for seq in ([] if stalled else self.scheduler_order()):
            if budget_left == 0:
                break
            if self.fits(seq, len(self.running) + len(self.prefilling), 0, budget_left):
                self.admit(seq, now, budget_left)
                self.prefilling.append(seq)
                chunk = min(seq.prefill_len - seq.prefill_done, budget_left)
                chunks.append((seq, chunk, seq.prefill_done))
                budget_left -= chunk
            elif not self.policy.skip_unfit:
                break
        if not decodes and not chunks:
            return None
        dur = self.lat.iteration_s(
            prefill_tokens=sum(c for _, c, _ in chunks),
            prefill_attn_pairs=sum(causal_pairs(c, before) for _, c, before in chunks),
            decode_seqs=len(decodes),
            decode_ctx_tokens=sum(s.p + s.o for s in decodes),
            prefill_seqs=len(chunks),
            overlap_cpu=self.cfg.async_scheduling,
        )
        end = now + dur
        self.decoded = len(decodes)
        for seq in decodes:
            self.emit_token(seq, end)
        for seq, chunk, _ in chunks:
            seq.prefill_done += chunk
            if seq.prefill_done == seq.prefill_len:
                self.finish_prefill(seq, end)
        return end

    # ---- invariants -------------------------------------------------------------------------
    def expected_blocks(self, seq: _Seq) -> int:
        """Blocks a request must hold privately (beyond the cached ones it references)."""
        shared = self.hb * len(seq.refs)
        if seq.state == "prefilling":   # reserved for the whole prefill, or what is computed
            return math.ceil((seq.prefill_done if self.chunk_alloc else seq.prefill_len) / self.bs) - shared
        if seq.state == "running":
            return math.ceil((seq.p + seq.o - 1) / self.bs) - shared  # newest token: no KV yet
        return 0

    def check_invariants(self, seqs: list[_Seq]) -> None:
        assert 0 <= self.used <= self.total, f"used blocks {self.used} outside [0, {self.total}]"
        refs: dict = {}
        for s in seqs:
            for h in s.refs:
                refs[h] = refs.get(h, 0) + 1
        assert {h: c for h, c in self.cache.items() if c} == refs, "reference counts"
        assert sorted(self.lru) == sorted(h for h, c in self.cache.items() if c == 0)
        assert self.used + self.hb * len(self.lru) <= self.total, "used + evictable > total"
        from_scratch = sum(self.expected_blocks(s) for s in seqs) + self.hb * len(refs)
        assert self.used == from_scratch, f"used blocks {self.used} != {from_scratch} recomputed"
        for s in seqs:
            assert s.blocks == self.expected_blocks(s), f"request {s.req.rid} holds {s.blocks}"
            assert 0 <= s.o <= s.d, f"request {s.req.rid}: o={s.o} outside [0, {s.d}]"
        assert len(self.running) + len(self.prefilling) <= self.cfg.max_num_seqs


class _RefFrontend:
    """Processor sharing, literally: jobs [remaining work, order, kind, request], each in
    service losing ``dt / n`` of work per ``dt``; reported jobs wait in a time-ordered list."""

    def __init__(self, model):
        self.model = model
        self.t = 0.0
        self.jobs: list[list] = []
        self.reports: list[tuple] = []   # (time, order, kind, seq), kept sorted
        self.order = 0
        self.ready: list[_Seq] = []
        self.queue: list[list] = []      # input jobs waiting for a worker (input_workers > 0), in order
        self.streams: list[tuple] = []   # (start, end, output work) of each decode iteration, in order
        self.backlogs: list[list] = []   # [reported at, done at] of each output backlog job, in order

    def report(self, time: float, kind: str, seq: _Seq) -> None:
        self.reports.append((time, self.order, kind, seq))
        self.order += 1
        self.reports.sort(key=lambda r: (r[0], r[1]))

    def stream(self, start: float, end: float, tokens: int) -> None:
        """A decode iteration gave ``tokens`` requests a token: their output work over it."""
        if tokens and self.model.output_token_s > 0.0:
            work = self.model.output_token_s * tokens
            self.streams.append((start, end, work))
            if work > end - start:   # what the iteration could not do: a job of its own at its end
                self.backlogs.append([end, math.inf])
                self.report(end, "backlog", (work - (end - start), self.backlogs[-1]))

    def _rate(self, t: float) -> tuple[float, float]:
        """(the jobs' share of the CPU at ``t``, the next time it may change)."""
        for start, end, work in self.streams:
            if end <= t:
                continue
            if start > t:
                return 1.0, start
            return max(0.0, 1.0 - work / (end - start)), end
        return 1.0, math.inf

    def _work(self, kind: str, seq) -> float:
        m = self.model
        if kind == "input":
            return m.request_s + m.prompt_token_s * seq.p
        if kind == "backlog":   # (its work and record stand where a request would)
            return seq[0]
        return m.first_token_s

    def next_time(self) -> float:
        """The next report, or the next completion if nothing more streams (a lower bound)."""
        done = (min(j[0] for j in self.jobs) * len(self.jobs) + self.t) if self.jobs else math.inf
        return min(done, self.reports[0][0] if self.reports else math.inf)

    def inputs_left(self) -> bool:
        return (any(j[2] == "input" for j in self.jobs) or any(r[2] == "input" for r in self.reports)
                or bool(self.queue))

    def advance(self, until: float) -> None:
        while True:
            n = len(self.jobs)
            rate, change = self._rate(self.t)
            done_at = (self.t + min(j[0] for j in self.jobs) * n / rate if rate > 0.0 else math.inf) if n else math.inf
            report_at = self.reports[0][0] if self.reports else math.inf
            if n and change < min(done_at, report_at) and change <= until:   # the share changes first
                for j in self.jobs:
                    j[0] -= rate * (change - self.t) / n
                self.t = change
                continue
            if min(done_at, report_at) > until or (not n and not self.reports):
                break
            if report_at <= done_at:
                time, order, kind, seq = self.reports.pop(0)
                if time > self.t:
                    for j in self.jobs:
                        j[0] -= rate * (time - self.t) / n
                self.t = max(self.t, time)
                job = [self._work(kind, seq), order, kind, seq]
                workers = self.model.input_workers
                if kind == "input" and workers and sum(j[2] == "input" for j in self.jobs) >= workers:
                    self.queue.append(job)   # every worker busy: it waits, in arrival order
                else:
                    self.jobs.append(job)
            else:
                job = min(self.jobs, key=lambda j: (j[0], j[1]))
                for j in self.jobs:
                    j[0] -= job[0] if j is not job else 0.0
                self.jobs.remove(job)
                job[0] = 0.0
                self.t = done_at
                if job[2] == "input" and self.queue:
                    self.jobs.append(self.queue.pop(0))   # a worker is free: the next waiting input starts
                self._complete(job[2], job[3], done_at)
        if self.jobs and until > self.t and until != math.inf:
            rate, change = self._rate(self.t)   # (until <= change here)
            for j in self.jobs:
                j[0] -= rate * (until - self.t) / len(self.jobs)
            self.t = until

    def _complete(self, kind: str, seq: _Seq, t: float) -> None:
        if kind == "input":
            self.ready.append(seq)
        elif kind == "first":
            seq.seen_first_token_s = t
        else:
            seq[1][1] = t

    def finish_times(self, seqs) -> None:
        """Client-side ends (after the jobs ran out): the later of the engine's last token, the
        first chunk and the last output backlog job reported by the engine's last token."""
        for s in seqs:
            if s.finish_s is not None and s.seen_first_token_s is not None:
                behind = [done for at, done in self.backlogs if at <= s.finish_s]
                s.seen_finish_s = max(s.finish_s, s.seen_first_token_s, behind[-1] if behind else 0.0)


def _assert_admissible(req: RefRequest, cfg: EngineConfig) -> None:
    """The caller filters rejectable requests; here they are a bug in the test or the caller."""
    p, d = req.prompt_tokens, req.decode_tokens
    assert p >= 1 and d >= 1, f"request {req.rid}: p={p}, d={d} must be >= 1"
    assert p + d <= cfg.context_len, f"request {req.rid} exceeds max_model_len"
    assert math.ceil((p + d) / cfg.block_size) <= cfg.total_blocks - cfg.watermark_blocks, (
        f"request {req.rid} exceeds the KV capacity")
    if not cfg.chunked_prefill:
        assert p <= cfg.token_budget, f"request {req.rid} exceeds max_num_batched_tokens"


def _wake_s(model, earlier: list, route_s: float) -> float:
    """``FrontendModel.wake_s`` literally: the instance is idle at ``route_s`` if every request
    routed to it before has finished by then; idle since the last of those finishes (0 if none)."""
    if not model.wake_s or any(e.finish_s is None or e.finish_s > route_s for e in earlier):
        return 0.0
    return model.wake_delay_s(route_s - max((e.finish_s for e in earlier), default=0.0))


def simulate_reference(requests: list[RefRequest], cfg: EngineConfig, check: bool = True,
                       hash_block_tokens: int = 0) -> tuple[list[RefResult], RefStats]:
    """Run one instance iteration by iteration until every request has finished.

    ``requests`` must be sorted by ``route_s``; ties join the queue in list order. With
    ``check`` the block, sequence, token and clock invariants are asserted after every iteration.
    """
    for a, b in zip(requests, requests[1:]):
        assert a.route_s <= b.route_s, "requests must be sorted by route_s"
    for req in requests:
        _assert_admissible(req, cfg)
    if cfg.enable_prefix_caching and hash_block_tokens:
        assert hash_block_tokens % cfg.block_size == 0, "hash_block_tokens % block_size != 0"
    inst = _Instance(cfg, hash_block_tokens)
    seqs = [_Seq(r, i) for i, r in enumerate(requests)]
    step = inst.step_chunked if cfg.chunked_prefill else inst.step_unchunked
    nxt = 0  # index of the next request not yet routed
    now = requests[0].route_s if requests else 0.0
    fe = inst.frontend
    joined = 0
    while any(s.state != "finished" for s in seqs):
        n_fresh = len(inst.fresh)   # async scheduling: what joins at this iteration start is new to it
        if fe is not None:
            # Every request goes through the frontend's input job first, reported when the clock
            # reaches its route time (a woken server's extra delay depends on what ran before).
            while nxt < len(seqs) and seqs[nxt].req.route_s <= now:
                s = seqs[nxt]
                fe.report(s.req.route_s + fe.model.delay_s + _wake_s(fe.model, seqs[:nxt], s.req.route_s), "input", s)
                nxt += 1
            fe.advance(now)
            for s in fe.ready:   # queue order = the order they reach the waiting queue
                s.state = "waiting"
                s.queue_index = joined
                joined += 1
                inst.fresh.append(s)
            fe.ready = []
        while fe is None and nxt < len(seqs) and seqs[nxt].req.route_s <= now:
            seqs[nxt].state = "waiting"
            inst.fresh.append(seqs[nxt])
            nxt += 1
        busy = inst.preempted or inst.fresh or inst.prefilling or inst.running
        if not busy:
            if fe is not None:   # idle: jump to the frontend's next event or the next route
                nxt_route = seqs[nxt].req.route_s if nxt < len(seqs) else math.inf
                assert fe.inputs_left() or nxt_route < math.inf, "requests left but none in the frontend"
                now = max(now, min(fe.next_time(), nxt_route))
                continue
            now = max(now, seqs[nxt].req.route_s)  # idle: jump to the next route
            continue
        new = len(inst.fresh) - n_fresh
        if cfg.async_scheduling and new:
            # The iteration at ``now`` was scheduled when the previous one started, before these
            # requests joined: it runs without them, or, if it has nothing else, with them.
            hidden = inst.fresh[len(inst.fresh) - new:]
            del inst.fresh[len(inst.fresh) - new:]
            end = step(now) if (inst.preempted or inst.fresh or inst.prefilling or inst.running) else None
            inst.fresh.extend(hidden)
            if end is None:
                end = step(now)
        else:
            end = step(now)
        if end is None:
            raise RuntimeError(
                f"instance stuck at t={now}: waiting requests can never be admitted on an empty "
                f"instance (a readmission prefill p + o above max_num_batched_tokens?)")
        assert end >= now, "iteration with negative duration"
        if fe is not None:
            fe.stream(now, end, inst.decoded)
        inst.decoded = 0
        inst.iterations += 1
        now = end
        if check:
            inst.check_invariants(seqs)
    if fe is not None:
        fe.advance(math.inf)
        fe.finish_times(seqs)
    results = [RefResult(s.req.rid, s.first_scheduled_s, s.first_token_s, s.finish_s, s.preemptions,
                         s.seen_first_token_s, s.seen_finish_s)
               for s in seqs]
    stats = RefStats(inst.iterations, inst.preemption_count, inst.peak, now, tuple(inst.counts))
    return results, stats
