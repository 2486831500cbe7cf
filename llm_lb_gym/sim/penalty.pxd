# C types for penalty.py when it is compiled (see setup.py, _compiled.py).
cimport cython
from .engine cimport Engine
from .progress cimport ProgressSums

cdef class Completions:
    cdef public double fin_w, met_w

@cython.locals(total=double, fin_w=double, met_w=double, j=long, T=double, nf=long, nm=long,
               t0=double, a=double, c=double, G0=long, t_last=double, k=long, t=double,
               value=double, sat_next=double, p0=double, A1=double, A2=double, A3=double, G=long,
               run=double, pg=ProgressSums)
cpdef double grid_penalty(Engine e, long k0, double dt, long k1, double w, double g,
                          Completions out)
@cython.locals(e=Engine, total=double, fin=long, fin_w=double, met_w=double, out=Completions)
cpdef tuple grid_penalties(list engines, long k0, double dt, long k1, double w=*, double g=*)
@cython.locals(e=Engine, total=double, fin=long, fin_w=double, met_w=double, k_end=long,
               pen=double, fw=double, mw=double, wj=double, j=long, T=double, nf=long, nm=long)
cpdef tuple grid_penalties_until_idle(list engines, long k0, double dt, double w=*, double g=*)
@cython.locals(e=Engine, pen=double, fin=long)
cpdef tuple tick_penalties(list engines, double T)
