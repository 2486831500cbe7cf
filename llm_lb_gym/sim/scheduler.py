"""One instance's waiting queue and the choice of which waiting requests are admitted next.

The queue holds requests that have no KV blocks: preempted ones (``preempted_q``, always tried
first, in preemption order) and never-run ones (``waiting_q``, in route order, tried in the
batching policy's order: ``batching.py``). ``select`` walks them and admits each request the
instance can take now (``docs/simulator_semantics.md``, "Admission"): a free sequence slot, its
tokens within the iteration's token budget, and its KV blocks above the watermark, counting
only its uncached part with prefix caching. The KV cache (``kv_cache.py``) says what an
admission costs and allocates it; the engine (``engine.py``) runs the admitted prefills.

Why apart from the engine: this is the part a study of schedulers swaps, and the one whose
rules the reference (``reference.py``) restates; the engine's clock, decode lockstep and
penalty aggregates do not depend on which request is picked.

Compiled by Cython with ``scheduler.pxd`` (see ``_compiled.py``); the engine holds a typed
reference, so ``select`` is a C call and the queues C fields.
"""

from __future__ import annotations

from itertools import chain

from .batching import get_policy
from .kv_cache import KVCache


class Scheduler:
    """Waiting queue and admission of one instance (``cfg``: its ``EngineConfig``)."""

    def __init__(self, cfg, table, kv: KVCache):
        self.table = table
        self.kv = kv
        self.name = cfg.scheduler
        policy = get_policy(cfg.scheduler)
        self._sort_key = policy.key     # None: queue order (the waiting list is already sorted)
        self._skip_unfit = policy.skip_unfit
        self.max_seqs = cfg.max_num_seqs
        self.budget = cfg.token_budget
        self.chunk_alloc = cfg.kv_allocation == "chunk"   # blocks for the first chunk only
        # Request ids. Preempted requests go first, in preemption order.
        self.preempted_q: list[int] = []
        self.waiting_q: list[int] = []

    def num_waiting(self) -> int:
        return len(self.preempted_q) + len(self.waiting_q)

    def order(self):
        """Preempted requests first, then the waiting ones in the batching policy's order."""
        key = self._sort_key
        if key is None:
            return chain(self.preempted_q, self.waiting_q)
        tb = self.table
        return chain(self.preempted_q, sorted(
            self.waiting_q, key=lambda r: key(tb.prompt[r], tb.o_base[r], tb.pred[r])))

    def select(self, nseq: int, budget: int | None = None) -> list[int]:
        """Admit from the waiting queue next to ``nseq`` sequences already on the instance (the
        caller has brought ``kv.used`` up to date); returns the admitted ids, their blocks
        allocated and their ids off the queue.

        Without ``budget`` (no chunking) each request needs its whole ``p + o`` tokens within
        the token budget; with it (chunked prefill) admissions stop when the budget is spent.
        Blocks: for all ``p + o`` tokens, or with ``kv_allocation=chunk`` for its first chunk.
        """
        kv = self.kv
        if kv.pc:
            return self._select_cached(nseq, budget)
        tb, bs = self.table, kv.bs
        free = kv.total_blocks - kv.used
        tokens = taken = 0
        skip = self._skip_unfit
        out: list[int] = []
        for r in self.order():
            if nseq >= self.max_seqs or (budget is not None and budget <= 0):
                break
            L = tb.prompt[r] + tb.o_base[r]
            need = -(-(min(L, budget) if self.chunk_alloc else L) // bs)
            if (budget is not None or tokens + L <= self.budget) and free - need >= kv.watermark:
                out.append(r)
                nseq += 1
                tokens += L
                free -= need
                taken += need
                if budget is not None:
                    budget -= L
            elif not skip:
                break
        if out:
            kv.allocate(taken)
            self._remove_waiting(out)
        return out

    def _select_cached(self, nseq: int, budget) -> list[int]:
        """``select`` with prefix caching: a request needs blocks only for its uncached part,
        plus the cached blocks that are evictable now (they leave the free pool), and its
        tokens are the uncached suffix. Admissions are applied one by one, so a request's
        fresh blocks may evict cached ones that the next request in the walk would have hit.
        Each admitted request's reused prompt tokens are in ``table.cached_tokens``."""
        kv = self.kv
        tb, bs, hb, H = self.table, kv.bs, kv.hb, kv.H
        tokens = 0
        skip = self._skip_unfit
        out: list[int] = []
        for r in self.order():
            if nseq >= self.max_seqs or (budget is not None and budget <= 0):
                break
            L = tb.prompt[r] + tb.o_base[r]
            n = kv.hit_units(r, L)
            reuse = kv.evictable_hits(r, n) if n else 0
            need = -(-(min(L, n * H + budget) if self.chunk_alloc else L) // bs) - hb * n
            c = L - n * H
            if ((budget is not None or tokens + c <= self.budget)
                    and kv.total_blocks - kv.used - need - hb * reuse >= kv.watermark):
                out.append(r)
                nseq += 1
                tokens += c
                kv.take(r, n, need, L)
                if budget is not None:
                    budget -= c
            elif not skip:
                break
        if out:
            self._remove_waiting(out)
        return out

    def _remove_waiting(self, out: list[int]) -> None:
        if self._sort_key is None and not self._skip_unfit:   # admitted = a prefix of the order
            k = len(self.preempted_q)
            if len(out) <= k:
                del self.preempted_q[:len(out)]
            else:
                del self.waiting_q[:len(out) - k]
                self.preempted_q.clear()
        else:
            s = set(out)
            self.preempted_q = [r for r in self.preempted_q if r not in s]
            self.waiting_q = [r for r in self.waiting_q if r not in s]
