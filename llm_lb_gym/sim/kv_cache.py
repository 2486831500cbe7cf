"""One instance's KV cache: the block pool and the automatic prefix cache over it.

What it owns: how many of the ``total_blocks`` blocks of ``block_size`` tokens are held by
requests (``used``), the peak of that, and, with prefix caching (``docs/prefix_caching.md``),
the cached hash blocks of ``hb`` engine blocks each: a map hash id -> reference count, those at
0 evictable in LRU order. Invariants, asserted where blocks change:
``0 <= used`` and ``used + ev_blocks <= total_blocks`` (the evictable blocks sit in the pool
too), reference counts ``>= 0``. ``Engine._check`` recomputes every count from the requests.

What it does not own: when the running sequences need their next block. They grow one token per
decode iteration in lockstep, so the engine counts their demand per block phase and hands the
total over lazily (``grow``); which request is admitted is the scheduler's
(``scheduler.py``), which asks this cache what an admission costs and then ``take``s it.

Compiled by Cython with ``kv_cache.pxd`` (see ``_compiled.py``); the engine and the scheduler
hold typed references, so these are C calls and the fields C fields.
"""

from __future__ import annotations

from collections import OrderedDict


class KVCache:
    """Block pool and prefix cache of instance ``index`` (for messages)."""

    def __init__(self, index: int, cfg, table):
        self.index = index
        self.table = table
        self.bs = cfg.block_size
        self.total_blocks = cfg.total_blocks
        self.watermark = cfg.watermark_blocks
        self.used = 0           # blocks held by requests (the engine syncs decode growth lazily)
        self.peak_used = 0      # most blocks held at once (after each allocation)
        # Prefix caching: cached hash blocks of ``hb`` engine blocks each (H tokens).
        self.pc = cfg.enable_prefix_caching
        self.H = self.hb = 0
        if self.pc and table.hash_block_tokens:
            if table.hash_block_tokens % self.bs:
                raise ValueError(
                    f"hash_block_tokens={table.hash_block_tokens} of the workload must be a "
                    f"multiple of engine.block_size={self.bs} with enable_prefix_caching")
            self.H = table.hash_block_tokens
            self.hb = self.H // self.bs
        self.kv_ref: dict = {}
        # OrderedDict, not dict: popping the oldest of a dict that had many deletions at its
        # front scans the holes (quadratic over an episode).
        self.evictable = OrderedDict()
        self.ev_blocks = 0          # engine blocks of the evictable (cached, unreferenced) units
        self.pc_tokens = self.pc_hit_tokens = 0       # first admissions: prompt / cached tokens
        self.pc_re_tokens = self.pc_re_hit_tokens = 0  # readmissions after preemption
        self.pc_evictions = 0

    # ------------------------------------------------------------ the block pool
    def grow(self, n: int) -> None:
        """The running sequences took ``n`` more blocks (their decode growth since the last
        sync): evict cached blocks where the pool overflows."""
        self.used += n
        if self.used > self.peak_used:
            self.peak_used = self.used
        if self.ev_blocks and self.used + self.ev_blocks > self.total_blocks:
            self.evict()

    def allocate(self, n: int) -> None:
        """Admissions without prefix caching took ``n`` blocks (checked free by the caller)."""
        self.used += n
        if self.used > self.peak_used:
            self.peak_used = self.used

    def add_block(self) -> None:
        """One running sequence took its next block (the caller preempted until one was free;
        it records the peak once the iteration's blocks are all given)."""
        self.used += 1
        if self.ev_blocks and self.used + self.ev_blocks > self.total_blocks:
            self.evict()

    def note_peak(self) -> None:
        assert self.used <= self.total_blocks, "KV blocks over capacity"
        if self.used > self.peak_used:
            self.peak_used = self.used

    def drop(self, rid: int, o: int) -> None:
        """Request ``rid`` with ``o`` generated tokens leaves (finished or preempted): free its
        blocks (all tokens but the last have KV); its cached prefix blocks stay cached."""
        self.used -= -(-(self.table.prompt[rid] + o - 1) // self.bs)
        if self.pc:
            self.release(rid)
        assert self.used >= 0, "negative KV blocks"

    # ---------------------------------------------------------- the prefix cache
    def hit_units(self, rid: int, L: int) -> int:
        """Leading hash blocks of ``rid``'s prompt cached here, for a prefill of ``L`` tokens:
        full blocks only, and at most ``(L - 1) // H`` so that one token is computed (vLLM)."""
        tb = self.table
        hs = tb.hashes[rid]
        if hs is None or not self.H:
            return 0
        n_max = min(len(hs), tb.prompt[rid] // self.H, (L - 1) // self.H)
        ref = self.kv_ref
        n = 0
        while n < n_max and hs[n] in ref:
            n += 1
        return n

    def evictable_hits(self, rid: int, n: int) -> int:
        """How many of ``rid``'s first ``n`` (cached) hash blocks are evictable now: taking
        them removes them from the free pool."""
        hs = self.table.hashes[rid]
        ref = self.kv_ref
        reuse = 0
        for i in range(n):
            if not ref[hs[i]]:
                reuse += 1
        return reuse

    def take(self, rid: int, n: int, need: int, L: int) -> int:
        """Admit ``rid`` with ``n`` cached hash blocks: reference them, allocate ``need`` fresh
        blocks (evicting least recently used cached blocks when no empty block is left).
        Returns the prompt tokens reused."""
        tb, hb, ref, ev = self.table, self.hb, self.kv_ref, self.evictable
        hs = tb.hashes[rid]
        for i in range(n):
            h = hs[i]
            c = ref[h]
            if not c:
                del ev[h]
                self.ev_blocks -= hb
                self.used += hb
            ref[h] = c + 1
        tb.kv_refs[rid] = n
        q = n * self.H
        tb.cached_tokens[rid] = q
        if tb.preemptions[rid]:
            self.pc_re_tokens += L
            self.pc_re_hit_tokens += q
        else:
            self.pc_tokens += L
            self.pc_hit_tokens += q
        self.used += need
        if self.used + self.ev_blocks > self.total_blocks:
            self.evict()
        if self.used > self.peak_used:
            self.peak_used = self.used
        assert self.used <= self.total_blocks, "KV blocks over capacity"
        return q

    def register(self, rid: int) -> None:
        """The prefill of ``rid`` is computed: its full prompt hash blocks become cached. A
        block whose hash is cached already (a concurrent request computed the same prefix)
        is merged into it: the request references the cached one and frees its own copy."""
        tb = self.table
        hs = tb.hashes[rid]
        if hs is None or not self.H:
            return
        hb, ref, ev = self.hb, self.kv_ref, self.evictable
        n0 = tb.kv_refs[rid]
        n_full = min(len(hs), tb.prompt[rid] // self.H)
        for i in range(n0, n_full):
            h = hs[i]
            c = ref.get(h, -1)
            if c < 0:     # new: the request's own blocks become the cached copy
                ref[h] = 1
            elif c == 0:  # evictable copy: take it back, drop ours (used unchanged)
                del ev[h]
                self.ev_blocks -= hb
                ref[h] = 1
            else:
                ref[h] = c + 1
                self.used -= hb
        if n_full > n0:
            tb.kv_refs[rid] = n_full
        assert self.used >= 0, "negative KV blocks"

    def release(self, rid: int) -> None:
        """Drop ``rid``'s references; unreferenced blocks stay cached and become evictable,
        the chain's tail first so that LRU eviction keeps the shared head longest (vLLM)."""
        tb = self.table
        n = tb.kv_refs[rid]
        if not n:
            return
        hs, hb, ref, ev = tb.hashes[rid], self.hb, self.kv_ref, self.evictable
        self.used += hb * n   # the caller freed all its blocks; the shared ones are counted here
        for i in range(n - 1, -1, -1):
            h = hs[i]
            c = ref[h] - 1
            assert c >= 0, "negative prefix block reference count"
            ref[h] = c
            if not c:
                ev[h] = None
                self.ev_blocks += hb
                self.used -= hb
        tb.kv_refs[rid] = 0

    def evict(self) -> None:
        """No empty block left: drop least recently used evictable cached blocks until the
        blocks in use and the evictable ones fit the cache again."""
        ev, ref, hb = self.evictable, self.kv_ref, self.hb
        while self.used + self.ev_blocks > self.total_blocks:
            h = ev.popitem(last=False)[0]
            del ref[h]
            self.ev_blocks -= hb
            self.pc_evictions += 1

    # ------------------------------------------------------------- invariants
    def check(self, holders, waiting) -> int:
        """Reference counts recomputed from the requests that hold blocks (``holders``) and
        those that must hold none (``waiting``), tests only; returns the blocks that sharing
        saves relative to every request holding its own copy (negative)."""
        tb, hb = self.table, self.hb
        counts: dict = {}
        refs = 0
        for r in holders:
            n = tb.kv_refs[r]
            refs += n
            held = tb.hashes[r][:n] if n else ()
            # Distinct ids: a repeat would count two blocks of prompt in one cached copy.
            assert len(set(held)) == n, f"instance {self.index}: request {r} references a hash twice"
            for h in held:
                counts[h] = counts.get(h, 0) + 1
        for r in waiting:
            assert tb.kv_refs[r] == 0, f"waiting request {r} holds cached blocks"
        for h, c in self.kv_ref.items():
            assert c >= 0, "negative prefix block reference count"
            assert c == counts.get(h, 0), f"instance {self.index}: hash {h} refcount {c}"
            assert (c == 0) == (h in self.evictable)
        assert len(counts) == sum(1 for c in self.kv_ref.values() if c)
        assert self.ev_blocks == hb * len(self.evictable)
        assert self.used + self.ev_blocks <= self.total_blocks, "used + evictable > total"
        return hb * (len(counts) - refs)

