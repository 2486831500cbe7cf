"""How long one iteration of an instance takes: the latency model's formula as tables and closed
forms the engine can evaluate in O(1).

``latency.py`` defines an iteration's duration (``LatencyModel.iteration_s``); this module holds
the same numbers rearranged for the engine's hot paths, which is why it exists apart from it:
- a prefill or mixed batch costs ``batch_s(n, pairs, nseq)`` plus its decode terms (the tiled
  roofline and the per-token segments inlined: a method call per iteration of the latency model
  costs more than the arithmetic; ``tests/test_engine_vs_reference.py`` holds them equal);
- a decode iteration of ``B`` sequences holding ``S`` context tokens costs
  ``dec_a[B] + dec_c[B] * S`` (``dec_a``: the terms fixed by B, ``dec_c``: the price per
  context token at batch size B, tabulated once);
- in a stretch of identical decode iterations the context grows by ``B`` per iteration, so
  iteration j starts at ``t0 + j a + c j (j - 1) / 2`` and ``iterations_before`` inverts that.

Compiled by Cython with ``iteration_timing.pxd`` (see ``_compiled.py``): the engine holds a
typed reference, so these are C calls.
"""

from __future__ import annotations

import math


class IterationTiming:
    """One instance's iteration-time coefficients (from its ``LatencyModel``)."""

    def __init__(self, lat, max_num_seqs: int, overlap_cpu: bool = False):
        # The CPU terms are zero when cpu_overhead is off. With overlap_cpu (async scheduling) the
        # tables hold the GPU side only and the CPU step (cb + cpc * n_seqs) is the floor of
        # every iteration: ``span`` and ``decode_s`` take the larger of the two.
        self.overlap = overlap_cpu
        self.cb, self.cpc = (lat.cpu_base_s, lat.cpu_seq_s) if overlap_cpu else (0.0, 0.0)
        if overlap_cpu:
            lat = lat.without_cpu()
        self.c0 = lat.base_s + lat.cpu_base_s
        self.ct, self.cc, self.knee = lat.token_s, lat.compute_token_s, lat.knee_tokens
        self.tile = lat.tile_tokens
        # The per-token linear-layer cost with token segments (LatencyModel.tokens_s), tabulated up
        # to the last segment's start; past it the last price runs on. seg_k 0: token_s * n.
        segs = lat.token_segments
        self.seg_k = segs[-1][0] if segs else 0
        self.seg_s = segs[-1][1] if segs else 0.0
        self.seg_tab = lat.tokens_table(self.seg_k) if segs else []
        self.ca, self.cps = lat.prefill_attn_s, lat.cpu_seq_s
        self.cds = lat.decode_seq_s
        # Decode iteration of B sequences = dec_a[B] + dec_c[B] * S: the parts fixed by B, per B.
        self.dec_a = lat.decode_const_table(max_num_seqs)
        self.dec_c = lat.decode_ctx_table(max_num_seqs)

    def batch_s(self, n: int, pairs: int, nseq: int) -> float:
        """Iteration time of a prefill or mixed batch without its decode-attention terms:
        ``n`` batched tokens, ``pairs`` causal prefill pairs, ``nseq`` sequences (latency.py)."""
        # LatencyModel.tiled, inlined.
        over = (n if self.tile == 1 else -(-n // self.tile) * self.tile) - self.knee
        if self.seg_k == 0:
            lin = self.ct * n
        elif n <= self.seg_k:
            lin = self.seg_tab[n]
        else:   # LatencyModel.tokens_s past the last start: its cost there plus the last price
            lin = self.seg_tab[self.seg_k] + self.seg_s * (n - self.seg_k)
        return (self.c0 + lin + (self.cc * over if over > 0.0 else 0.0)
                + self.ca * pairs + self.cps * nseq)

    def decode_s(self, B: int, S: int) -> float:
        """A decode iteration of ``B`` sequences holding ``S`` context tokens (B >= 1)."""
        if self.overlap:
            return max(self.dec_a[B] + self.dec_c[B] * S, self.cb + self.cpc * B)
        return self.dec_a[B] + self.dec_c[B] * S

    def span(self, gpu_s: float, nseq: int) -> float:
        """An iteration of ``nseq`` sequences whose other terms (``batch_s`` plus decode terms)
        take ``gpu_s``: itself, or with overlap_cpu the longer of it and the CPU step."""
        if self.overlap:
            cpu = self.cb + self.cpc * nseq
            return gpu_s if gpu_s >= cpu else cpu
        return gpu_s

    def cpu_floor(self, B: int) -> float:
        """The CPU step of a decode iteration of ``B`` sequences under overlap_cpu (0 without):
        no decode iteration is shorter."""
        return self.cb + self.cpc * B


def iterations_before(t: float, a: float, c: float, T: float) -> int:
    """Number of iterations j >= 0 with start t + j a + c j (j-1)/2 < T (at least 1)."""
    D = T - t
    b = a - c / 2
    k = math.ceil(2 * D / (b + (b * b + 2 * c * D) ** 0.5))
    while k > 1 and t + (k - 1) * a + c * (k - 1) * (k - 2) / 2 >= T:
        k -= 1
    while t + k * a + c * k * (k - 1) / 2 < T:
        k += 1
    return max(k, 1)
