# Cython declarations that augment engine.py when it is compiled (see llm_lb_gym/sim/_compiled.py
# and setup.py). engine.py stays plain Python and is the source of truth; this file only gives
# the compiler C types for the engine's attributes and locals and makes the internal methods
# direct C calls. Every attribute that engine.py assigns must be declared here (the build
# fails otherwise, and the install falls back to pure Python with a warning). Its parts
# (timing, kv, sched) are typed by their own .pxd files, so calls into them are C calls too.
cimport cython
from .iteration_timing cimport IterationTiming, iterations_before
from .kv_cache cimport KVCache
from .progress cimport ProgressSums
from .scheduler cimport Scheduler

cdef class Engine:
    cdef public long index
    cdef public long G, _used_G, B, S_at, G_S, admit_counter
    cdef public long n_finished, n_slo_met, n_preemptions, n_iterations, n_prefill_iterations
    cdef public long pending_prefill_tokens
    cdef public long _st_G0, _fe_G
    cdef public double t, _g_fin_end, _g_ex, committed_tokens, fe_next
    cdef public long fe_count, pend_n
    cdef public object fe, gap_log
    cdef public double _gap_stall
    cdef public long _gap_stall_n
    cdef public IterationTiming timing
    cdef public KVCache kv
    cdef public Scheduler sched
    cdef public ProgressSums progress
    cdef public double _st_t0, _st_a, _st_c, _st_n, _st_t_last
    cdef public bint fast, check, chunked, chunk_alloc, _blocked, _plan_dirty, count_mode, fe_wake, fe_out, asynch
    cdef public object table, latency
    cdef public dict running
    cdef public list prefilling, fin_heap, phase_cnt
    cdef public list prompt_counts, decode_counts

    cpdef _sync_used(self)
    cpdef bint idle(self)
    @cython.locals(wake=double)
    cpdef add(self, long rid, double now)
    cpdef _fe_release(self)
    @cython.locals(t0=double, a=double, c=double, t=double, G0=long, k=long)
    cpdef advance_to(self, double T)
    @cython.locals(cut=long, q=list, tail=list)
    cpdef _hidden_step(self)
    @cython.locals(admitted=list)
    cpdef bint _admit_step(self)
    cpdef bint in_decode_stretch(self)
    cpdef jump_in_stretch(self, long G, double t)
    cpdef _fe_flush(self)
    cpdef record_token_gaps(self)
    cpdef _log_gaps(self, double a, double c, long j0, long j1, long n)
    cpdef double penalty(self)
    cpdef double decode_iteration_s(self)
    @cython.locals(pg=ProgressSums)
    cpdef double earliest_completion_s(self)
    @cython.locals(cap=double)
    cpdef observe_into(self, list out, double kv_tokens)
    cpdef _enter_prompt_phase(self, long rid)
    cpdef _leave_prompt_phase(self, long rid)
    cpdef _rebase_S(self)
    @cython.locals(G=long, seq=long, p=long)
    cpdef _join_running(self, long rid, long o)
    @cython.locals(G=long, o=long, p=long)
    cpdef long _leave_running(self, long rid)
    cpdef _finish(self, long rid, long o, double now)
    @cython.locals(o=long)
    cpdef _preempt(self, long rid)
    cpdef list _select(self, object budget=*)
    cpdef long cached_prefix_tokens(self, long rid)
    cpdef _start(self, long rid, double s)
    @cython.locals(o=long)
    cpdef _complete_prefill(self, long rid, double end)
    @cython.locals(s=double, toks=long, pairs=long, L=long, end=double, q=long)
    cpdef _prefill_iteration(self, list admitted)
    @cython.locals(kv=KVCache, ph=long, bs=long)
    cpdef _grow_blocks(self)
    @cython.locals(kv=KVCache, bs=long, j=long, r=long, done=long, held=long)
    cpdef bint _steal_block(self, long first)
    @cython.locals(kv=KVCache)
    cpdef bint _chunk_blocks(self, long i, long k)
    @cython.locals(G=long, now=double, seq=long, rid=long, o=long)
    cpdef _end_decode(self)
    @cython.locals(full=long, rem=long, d=long, bs=long, i=long)
    cpdef long _demand(self, long G, long k)
    @cython.locals(kv=KVCache, G=long, free=long, B=long, bs=long, span=double, cycles=long, r=long, g=long,
                   cum=long, i=long, stop=double, t0=double, a=double, c=double, n=double, cdc=double, cpu=double, j=long,
                   tm=IterationTiming)
    cpdef _plan(self)
    @cython.locals(t0=double, a=double, c=double, k=long, n=long, G=long)
    cpdef _decode(self, double T)


@cython.locals(e=Engine)
cpdef advance_all(list engines, double T)
