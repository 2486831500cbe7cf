# cython: language_level=3, cdivision=False
"""The env step's per-step arithmetic in C, for the compiled engine (optional; ``_kernels.py``).

The reference is plain Python: ``ObservationBuilder.observe`` (``observation.py``) and
``reward.guidance_term``. These compute the same values in the same order, so they are
bit-identical (``tests/test_step_kernels.py`` compares them state by state, and the compiled
engine's tests compare whole episodes against the pure-Python env): a float32 observation entry
is the Python value cast to float32 (int -> double -> float, as numpy does), times its float32
scale, in float32; the guidance term is the same double arithmetic (built with
``-ffp-contract=off``, no fused multiply-add). They read the compiled engine's fields as C
(``Engine`` is cimported), so they serve only clusters of the compiled engine; the env decides
at each reset (``ObservationBuilder.fast_observe``).
"""

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.stdlib cimport free, malloc

from llm_lb_gym.sim._engine_c cimport Engine


cdef class FlatObservation:
    """``ObservationBuilder.observe`` of the layouts without extra features and without
    rounding: the global block (router queue length, optionally ``arrivals_left``), k candidate
    blocks (prompt tokens, predicted decode bucket, predicted decode tokens), m instance blocks
    (P counts, D counts, capacity, earliest completion). A new array each call, filled in C."""

    cdef object template
    cdef tuple args
    cdef float *scale
    cdef double *kv
    cdef Py_ssize_t size, m, k, n_p, n_d, cand0, inst0, queue_cap
    cdef bint arrivals

    def __cinit__(self):
        self.scale = NULL
        self.kv = NULL

    def __init__(self, scale, kv_tokens, Py_ssize_t num_candidates, Py_ssize_t n_p,
                 Py_ssize_t n_d, queue_cap, bint arrivals_left):
        cdef Py_ssize_t i
        self.args = (scale, kv_tokens, num_candidates, n_p, n_d, queue_cap, arrivals_left)
        self.size = len(scale)
        self.m = len(kv_tokens)
        self.k = num_candidates
        self.n_p, self.n_d = n_p, n_d
        # Any length a queue can have is below PY_SSIZE_T_MAX: a larger cap is the same as it.
        self.queue_cap = queue_cap if queue_cap < PY_SSIZE_T_MAX else PY_SSIZE_T_MAX
        self.arrivals = arrivals_left
        self.cand0 = 1 + arrivals_left
        self.inst0 = self.cand0 + 3 * self.k
        if self.inst0 + self.m * (n_p + n_d + 2) != self.size:
            raise ValueError("FlatObservation: the scale does not match the layout")
        self.scale = <float *> malloc(self.size * sizeof(float))
        self.kv = <double *> malloc(self.m * sizeof(double))
        if self.scale == NULL or self.kv == NULL:
            raise MemoryError()
        for i in range(self.size):
            self.scale[i] = <float> scale[i]
        for i in range(self.m):
            self.kv[i] = <double> kv_tokens[i]
        import numpy as np
        self.template = np.zeros(self.size, dtype=np.float32)

    def __dealloc__(self):
        free(self.scale)
        free(self.kv)

    def __reduce__(self):   # the env pickles and deep-copies
        return FlatObservation, self.args

    def observe(self, cluster, tuple candidates):
        cdef object out = self.template.copy()
        cdef Py_buffer view
        PyObject_GetBuffer(out, &view, PyBUF_WRITABLE)
        try:
            self._fill(<float *> view.buf, cluster, candidates)
        finally:
            PyBuffer_Release(&view)
        return out

    cdef _fill(self, float *o, cluster, tuple candidates):
        cdef float *sc = self.scale
        cdef Py_ssize_t i, j, b, n, pos
        cdef Py_ssize_t ql
        cdef double cap
        cdef Engine e
        cdef list engines = cluster.engines
        cdef list counts
        q = cluster.queue
        ql = len(q)
        o[0] = (<float> <double> (ql if ql < self.queue_cap else self.queue_cap)) * sc[0]
        if self.arrivals:
            tb = cluster.table
            o[1] = (<float> <double> (tb.n - cluster.n_arrived)) * sc[1]
        n = len(candidates)
        pos = self.cand0
        if n:
            tb = cluster.table
            prompt, bucket, pred = tb.prompt, tb.decode_bucket, tb.pred
            for j in range(n if n < self.k else self.k):
                r = candidates[j]
                o[pos] = (<float> <double> prompt[r]) * sc[pos]
                o[pos + 1] = (<float> <double> bucket[r]) * sc[pos + 1]
                o[pos + 2] = (<float> <double> pred[r]) * sc[pos + 2]
                pos += 3
        while pos < self.inst0:   # empty candidate slots: 0
            o[pos] = (<float> 0.0) * sc[pos]
            pos += 1
        for i in range(self.m):
            e = <Engine?> engines[i]
            counts = e.prompt_counts
            for b in range(self.n_p):
                o[pos] = (<float> <double> counts[b]) * sc[pos]
                pos += 1
            counts = e.decode_counts
            for b in range(self.n_d):
                o[pos] = (<float> <double> counts[b]) * sc[pos]
                pos += 1
            cap = 1.0 - e.committed_tokens / self.kv[i]   # Engine.observe_into's arithmetic
            o[pos] = (<float> (cap if cap > -1.0 else -1.0)) * sc[pos]
            o[pos + 1] = (<float> (e.earliest_completion_s() if e.B else 0.0)) * sc[pos + 1]
            pos += 2


cpdef bint all_idle(list engines):
    """Every instance idle (``Engine.idle``): the action mask's ``mask_idle_defer`` test."""
    cdef Engine e
    for x in engines:
        e = <Engine?> x
        if not e.idle():
            return False
    return True


ENGINE_CLASS = Engine
"""The engine type these kernels read (``_kernels.kernels_for`` checks a cluster's engines)."""


cdef class MixingGuidance:
    """``reward.guidance_term`` with the mixing estimator's parameters bound, over the engines'
    committed tokens: ``h(engines, prompt, pred, chosen)`` = r_mix(chosen) - r_mix of the
    least-loaded instance (``routers.mixing.mixing_score``'s arithmetic, in the same order)."""

    cdef readonly double grad1, grad2, eps_s, alpha

    def __init__(self, double grad1, double grad2, double eps_s, double alpha):
        self.grad1, self.grad2, self.eps_s, self.alpha = grad1, grad2, eps_s, alpha

    def __reduce__(self):
        return MixingGuidance, (self.grad1, self.grad2, self.eps_s, self.alpha)

    cpdef double h(self, list engines, long prompt_tokens, double pred_decode_tokens,
                   Py_ssize_t chosen):
        cdef Engine e
        cdef double best = 0.0, load
        cdef Py_ssize_t i
        for i in range(len(engines)):
            e = <Engine?> engines[i]
            load = e.committed_tokens
            if i == 0 or load < best:   # min(): the first of the smallest
                best = load
        e = <Engine?> engines[chosen]
        return (self._score(e.committed_tokens, prompt_tokens, pred_decode_tokens)
                - self._score(best, prompt_tokens, pred_decode_tokens))

    cdef inline double _score(self, double load, long p, double d):
        cdef double tp = self.grad1 * (<double> (p * p) + load)
        cdef double rp = 1.0 if tp <= self.eps_s else 1.0 - tp / self.eps_s
        cdef double rd = -self.grad2 * (load + (<double> p + d))
        return self.alpha * rp + (1.0 - self.alpha) * rd
