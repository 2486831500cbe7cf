# C types for progress.py when it is compiled (see setup.py, _compiled.py).
cimport cython

cdef class ProgressSums:
    cdef public object table
    cdef public double pen_static, wait_left, pA1, pA2, pA3, wA1, wA2, _pen_value
    cdef public long wA3, n_sat_running, version, _pen_G, _pen_version
    cdef public list sat_heap

    @cython.locals(o=long, pred=double, f=double)
    cpdef enter_prompt(self, long rid)
    @cython.locals(o=long, pred=double, f=double)
    cpdef leave_prompt(self, long rid)
    @cython.locals(pred=double, w=double, k=long)
    cpdef join_running(self, long rid, long o, long G, long seq)
    cpdef leave_running(self, long rid, long running_left)
    cpdef clear(self)
    @cython.locals(seq=long, rid=long)
    cpdef pop_saturated(self, long G)
    @cython.locals(w=double, pred=double, k=long)
    cpdef drop_linear_terms(self, long rid)
    @cython.locals(run=double, value=double)
    cpdef double penalty(self, long G)
    @cython.locals(run=double)
    cpdef double decode_tokens_left(self, long G)
