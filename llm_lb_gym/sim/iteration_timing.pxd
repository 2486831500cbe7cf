# C types for iteration_timing.py when it is compiled (see setup.py, _compiled.py).
cimport cython

cdef class IterationTiming:
    cdef public long tile, seg_k
    cdef public double c0, ct, cc, knee, ca, cps, cds, seg_s, cb, cpc
    cdef public bint overlap
    cdef public list dec_a, dec_c, seg_tab

    @cython.locals(over=double, lin=double)
    cpdef double batch_s(self, long n, long pairs, long nseq)
    cpdef double decode_s(self, long B, long S)
    @cython.locals(cpu=double)
    cpdef double span(self, double gpu_s, long nseq)
    cpdef double cpu_floor(self, long B)


@cython.locals(D=double, b=double, k=long)
cpdef long iterations_before(double t, double a, double c, double T)
