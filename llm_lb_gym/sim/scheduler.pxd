# C types for scheduler.py when it is compiled (see setup.py, _compiled.py).
cimport cython
from .kv_cache cimport KVCache

cdef class Scheduler:
    cdef public object table, name, _sort_key
    cdef public KVCache kv
    cdef public bint _skip_unfit, chunk_alloc
    cdef public long max_seqs, budget
    cdef public list preempted_q, waiting_q

    cpdef long num_waiting(self)
    @cython.locals(kv=KVCache, bs=long, free=long, tokens=long, taken=long, skip=bint, L=long,
                   need=long)
    cpdef list select(self, long nseq, object budget=*)
    @cython.locals(kv=KVCache, bs=long, hb=long, H=long, tokens=long, skip=bint, L=long, n=long,
                   reuse=long, need=long, c=long)
    cpdef list _select_cached(self, long nseq, object budget)
    @cython.locals(k=long)
    cpdef _remove_waiting(self, list out)
