"""The simulator configured as a llama.cpp server: slots, per-slot context, one mixed batch.

Why: the sim-to-real comparison (``experiments/sim_to_real.py``) runs the same requests through
``llama-server`` processes and through the simulator; the simulator's instance is vLLM-shaped
(paged KV blocks, a waiting queue, optional chunked prefill), so it is set up to behave as
llama.cpp's scheduler does (``tools/server`` of llama-cpp-python 0.3.36's llama.cpp):

- ``--parallel P`` slots: at most P sequences run at once (``max_num_seqs = P``); a request
  that finds every slot busy waits in the server's queue (its "deferred" tasks), as in the
  simulator's waiting queue, first come first served;
- ``-c C`` KV cells split evenly over the slots (``n_ctx_slot = C / P``, not unified): each
  request's prompt + output must fit ``C / P`` (``max_model_len``), and P such requests always
  fit the C tokens (``num_kv_blocks = C / block_size``, ``watermark`` 0), so the simulator never
  preempts, as llama.cpp never does;
- one batch per iteration holds every generating slot's next token and then the new prompts'
  tokens up to ``n_batch`` (2,048): decodes and prefills mix in one forward pass, which is the
  simulator's chunked-prefill scheduling with a token budget of ``n_batch``;
- the first token comes from the prompt's iteration; with ``ignore_eos`` a request generates
  exactly ``max_tokens`` tokens, as the simulator's requests do.

What is not modelled: llama.cpp splits a batch into ``n_ubatch`` (512) sub-batches, run one
after the other (the latency model is additive in tokens, so only the attention pairs across
sub-batches differ); its prompt cache (off in the comparison: ``cache_prompt`` false); a slot
whose context fills up shifts its context instead of stopping (never reached: requests fit).
"""

from __future__ import annotations

from ..sim.config import EngineConfig

LLAMACPP_PRESET = "smollm2-135m-llamacpp-cpu"
"""The latency preset fitted to llama-server on one core (``experiments/calibrate_llamacpp.py``)."""
LLAMACPP_N_BATCH = 2048
"""llama-server's default logical batch (``-b``): the most tokens of one iteration."""
KV_BLOCK_TOKENS = 16
"""Block size of the simulated KV cache (llama.cpp allocates cells one token at a time; any
block size that divides the slot context gives the same capacity)."""


def llamacpp_engine_config(parallel: int, ctx_tokens: int, preset: str = LLAMACPP_PRESET,
                           n_batch: int = LLAMACPP_N_BATCH) -> EngineConfig:
    """The :class:`EngineConfig` of one ``llama-server --parallel parallel -c ctx_tokens``."""
    from .._validate import ConfigError, check_int

    check_int("parallel", parallel, 1, 1024)
    check_int("ctx_tokens", ctx_tokens, 2 * parallel)
    slot = ctx_tokens // parallel
    if slot % KV_BLOCK_TOKENS or ctx_tokens % parallel:
        raise ConfigError(f"ctx_tokens={ctx_tokens} / parallel={parallel} = {ctx_tokens / parallel:g} tokens per "
                          f"slot; allowed: a multiple of {KV_BLOCK_TOKENS} (so the slots tile the KV blocks)")
    return EngineConfig(preset=preset, block_size=KV_BLOCK_TOKENS, num_kv_blocks=ctx_tokens // KV_BLOCK_TOKENS,
                        watermark=0.0, max_num_seqs=parallel, max_model_len=slot, chunked_prefill=True,
                        max_num_batched_tokens=max(n_batch, parallel))


_TIME_TERMS = ("base_s", "token_s", "compute_token_s", "prefill_attn_s", "decode_seq_s", "decode_ctx_s",
               "decode_ctx_small_s", "cpu_base_s", "cpu_seq_s")


def scaled_latency(lat, factor: float):
    """``lat`` with every time term times ``factor``: the same core, ``factor`` times slower.

    Why: the preset holds a core's own speed (the profile's times net of the waits for a CPU,
    ``experiments/calibrate_llamacpp.py``); in a replay N servers, the router, the load
    generator and other users' jobs share the machine's cores, and a llama.cpp thread then runs
    on a uniformly slower clock (to first order: time slices, not the work, change). The
    sim-to-real command measures the factor over each replay with :func:`slowdown`."""
    from dataclasses import replace

    from .._validate import check_range

    check_range("speed factor", factor, 0.0, 1e3, lo_open=True)
    out = replace(lat, **{f: getattr(lat, f) * factor for f in _TIME_TERMS})
    return replace(out, token_segments=tuple((k, p * factor) for k, p in lat.token_segments))


def phase_scaled_latency(lat, compute_factor: float, extra_iteration_s: float):
    """``lat`` with every time term x ``compute_factor`` and then ``extra_iteration_s`` added to
    every iteration (``base_s``; negative takes time off, down to ``base_s``'s floor of 1 us).

    Why two numbers, not one factor: on this VM the speed of the shared memory system drifts
    apart from the cores' (two quiet profiles 86 min apart: prefill x0.78-0.87, a one-stream
    decode step x0.54-0.60; beside a memory hog a one-stream decode step +29%, a 64-token prompt
    +7%, four streams +5%; docs/serving.md). A decode step of one stream reads every weight
    (~90 MB) once per iteration and computes one token; a prompt reuses those reads across its
    tokens. So the weight read is a cost per iteration that follows the memory system, and the
    rest follows the cores. The two are read off the server itself (``experiments/_contention.
    server_check_s``: a prompt's time per token, ``compute_factor`` against the profile's, and
    a one-stream decode step, whose change beyond ``compute_factor`` is ``extra_iteration_s``)."""
    from dataclasses import replace

    from .._validate import check_range

    check_range("compute factor", compute_factor, 0.0, 1e3, lo_open=True)
    check_range("extra iteration time", extra_iteration_s, -10.0, 10.0)
    out = scaled_latency(lat, compute_factor)
    return replace(out, base_s=max(out.base_s + extra_iteration_s, 1e-6))


def schedstat_s(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of process ``pid``'s main
    thread, from Linux's ``/proc/PID/schedstat``. llama-server with ``-t 1`` computes on its
    main thread (HTTP runs on others), so over an interval ``(run + wait) / run`` is how much
    slower than on a core of its own its iterations ran: the share of the CPUs it got while
    it had work. Why this and not a timing probe: it is measured over the replay itself, from
    the scheduler, and uses none of the latencies that the simulator is asked to predict."""
    with open(f"/proc/{pid}/schedstat") as f:
        run_ns, wait_ns = f.read().split()[:2]
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def slowdown(before: list[tuple[float, float]], after: list[tuple[float, float]]) -> float:
    """``sum(run + wait) / sum(run)`` between two readings of :func:`schedstat_s` per process
    (1.0: never waited for a CPU)."""
    run = sum(a[0] - b[0] for a, b in zip(after, before))
    wait = sum(a[1] - b[1] for a, b in zip(after, before))
    if run <= 0:
        raise ValueError("the servers got no CPU time between the two readings")
    return (run + wait) / run


def threads_runnable_s(exclude: set[int]) -> dict[int, float]:
    """Seconds each thread of the machine (every ``/proc/PID/task/TID``, but the ``exclude``\\ d
    thread ids) has been runnable: on a CPU or waiting for one (``/proc/.../schedstat``).

    Why: on a shared host (``sim/shared_host.py``) the servers compete with every other runnable
    thread; the difference of two readings over an interval, divided by its length, is the mean
    number of such threads, which is what the host model takes as ``background_threads``. A
    thread that ends between the readings is lost; one that starts counts from zero."""
    import glob

    out = {}
    for path in glob.glob("/proc/[0-9]*/task/[0-9]*/schedstat"):
        tid = int(path.split("/")[4])
        if tid in exclude:
            continue
        try:
            with open(path) as f:
                run_ns, wait_ns = f.read().split()[:2]
        except (OSError, ValueError):   # the thread ended while we read
            continue
        out[tid] = (int(run_ns) + int(wait_ns)) / 1e9
    return out


def background_threads(before: dict[int, float], after: dict[int, float], wall_s: float) -> float:
    """Mean runnable threads between two :func:`threads_runnable_s` readings ``wall_s`` apart."""
    if wall_s <= 0:
        raise ValueError(f"background_threads: wall_s={wall_s!r}; allowed: > 0")
    return sum(max(0.0, v - before.get(tid, 0.0)) for tid, v in after.items()) / wall_s
