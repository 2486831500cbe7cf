# C types for kv_cache.py when it is compiled (see setup.py, _compiled.py).
cimport cython

cdef class KVCache:
    cdef public long index, bs, total_blocks, watermark, used, peak_used
    cdef public bint pc
    cdef public long H, hb, ev_blocks, pc_tokens, pc_hit_tokens, pc_re_tokens, pc_re_hit_tokens
    cdef public long pc_evictions
    cdef public object table
    cdef public dict kv_ref
    cdef public object evictable   # an OrderedDict: typed as dict, Cython would bypass its order

    cpdef grow(self, long n)
    cpdef allocate(self, long n)
    cpdef add_block(self)
    cpdef note_peak(self)
    cpdef drop(self, long rid, long o)
    @cython.locals(n_max=long, n=long)
    cpdef long hit_units(self, long rid, long L)
    @cython.locals(reuse=long, i=long)
    cpdef long evictable_hits(self, long rid, long n)
    @cython.locals(hb=long, i=long, c=long, q=long)
    cpdef long take(self, long rid, long n, long need, long L)
    @cython.locals(hb=long, n0=long, n_full=long, i=long, c=long)
    cpdef register(self, long rid)
    @cython.locals(n=long, hb=long, i=long, c=long)
    cpdef release(self, long rid)
    @cython.locals(hb=long)
    cpdef evict(self)
