# C types for output_stream.py when it is compiled (see setup.py, _compiled.py): the frontend of
# every vLLM preset asks it for free CPU time at each of its events.
cimport cython
from .iteration_timing cimport iterations_before

cdef class OutputStream:
    cdef public double w, end
    cdef public object runs

    @cython.locals(S=double, a1=double, E=double, wn=double, m=long, mstar=long, k=long)
    cpdef list add(self, double t0, double a, double c, long j0, long j1, long n)
    cpdef prune(self, double t)
    @cython.locals(out=double, S=double, E=double, lo=double, hi=double, run=tuple)
    cpdef double free(self, double x, double y)
    @cython.locals(t=double, S=double, E=double, have=double, run=tuple)
    cpdef double when(self, double x, double amount)


@cython.locals(S=double, a1=double, c=double)
cpdef double _start(tuple run, long m)
@cython.locals(S=double, E=double, a1=double, c=double, m=long, wn=double, mstar=long, k=long, sk=double,
               tau=double, part=double, q=long)
cpdef double _free_to(tuple run, double t)
@cython.locals(S=double, E=double, a1=double, c=double, m=long, wn=double, mstar=long, b=double, q=long, k=long,
               before=double, tau=double, t=double)
cpdef double _time_of_free(tuple run, double A)
