"""How much slower this shared machine runs right now: a CPU probe's own slowdown.

Why: the llama.cpp measurements here run on two vCPUs shared with other people's jobs. The time
a server thread spends *waiting* for a CPU is in Linux's schedstat (``serve/llamacpp_sim.
schedstat_s``), but removing it does not remove the slower *execution* while the cores are
shared (the sibling hyperthread, caches and memory bandwidth taken by others): issue 33 found
the llama.cpp preset, profiled at load 5-6 net of waits, 50% slower than a fresh profile on a
quiet machine. So a fixed piece of work (a float32 matrix product on one BLAS thread and a sweep
over a 16 MB array: the compute and the memory traffic llama.cpp's kernels make) is timed in
CPU seconds of its own thread (``time.thread_time``: waits excluded); its time over the least
one measured in the profile is the execution slowdown of that moment.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np

_A = np.random.default_rng(0).standard_normal((192, 192)).astype(np.float32)
_SWEEP = np.ones(4 * 1024 * 1024, np.float32)   # 16 MB


@functools.cache
def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _one_blas_thread():
    """BLAS limited to the calling thread while the probe runs. Why: numpy's OpenBLAS splits a
    192 x 192 product over every core and the calling thread spin-waits for its workers, so on
    a busy machine its own CPU time counts the others' delays: measured here with two busy
    loops beside it, the probe's median was 67 ms with OpenBLAS's 2 threads and 12 ms with 1
    (package 0.7.0), which made sim_to_real's slowdown x21-x23 instead of ~x2."""
    return _blas_controller().limit(limits=1, user_api="blas")


def probe_s() -> float:
    """CPU seconds of the probe's thread for one fixed piece of work (~5-10 ms on this VM), on
    one BLAS thread whatever ``OMP_NUM_THREADS`` says."""
    with _one_blas_thread():
        t0 = time.thread_time()
        x = _A
        for _ in range(12):
            x = (x @ _A) * np.float32(1e-2)
        s = 0.0
        for _ in range(3):
            s += float(_SWEEP.sum())
        t1 = time.thread_time()
    assert np.isfinite(x).all() and s > 0
    return t1 - t0


def bracket_reading_s(before, after) -> float:
    """The reading of a stretch of work bracketed by probes or server checks: the mean of every
    reading just before it and just after it.

    Why one estimator for both sides: a profile point's reading (``calibrate_llamacpp``) and a
    replay's (``sim_to_real``) are divided by each other, so they must be the same statistic. In
    package 0.7.0 the profile took min(before, after) per repeat and the replay the median of
    raw probes; on this VM a raw probe's median runs 0-11% above the median of pairs' minima
    (200 probes, three trials), a bias that went straight into the correction.

    Why the mean, not the lesser of each pair (the 2026-12-06/07 runs): the stretch's time is
    the machine's *average* speed over it, and the lesser of two readings is biased fast by as
    much as the machine's speed varies. On a quiet profile (checks within 2% of each other) the
    two agree; during the 2026-12-07 replays this VM's speed moved +-25% (p10-p90) with a
    correlation time of 10-20 s (106 back-to-back checks: autocorrelation 0.54 at 1 s, 0.36 at
    11 s, 0.04 at 23 s), and the lesser of 3+3 checks 20-45 s apart read 0.88-0.90 of the
    average between them, the mean 0.99-1.02 (also the least spread of four statistics tried):
    the replays' prompts then ran 13% slower than the profile's fit at the checks' speed."""
    readings = [*before, *after]
    if len(before) != len(after):
        raise ValueError(f"bracket_reading_s: {len(before)} readings before and {len(after)} after; "
                         "allowed: as many after as before")
    if not readings:
        raise ValueError("bracket_reading_s: no probes")
    return float(np.mean(readings))


IDLE_CHECKS = 3
"""Server checks (:func:`server_check_s`) before and after each of sim_to_real's replays, the
servers taking turns, all idle (read by :func:`bracket_reading_s`: their mean, as the probes are);
``probe_machine_speed`` reads its stretches with as many."""


CHECK_PROMPT_TOKENS = 64
CHECK_OUTPUT_TOKENS = 32
"""The server speed check's request: a prompt of 64 tokens (one iteration, compute-bound: the
weights read once serve 64 tokens), then 31 decode steps of one stream (each reads every weight
for one token: memory-bound on this CPU)."""


def server_check_s(url: str, pid: int, model: str = "smollm2") -> tuple[float, float]:
    """The server's own speed now: (seconds per prompt token, seconds per decode step of one
    stream), from one request's ``timings`` (llama-server's own clock, no HTTP), each x the share
    of the request the server's thread was on a CPU (schedstat of ``pid``: waits left out, as the
    profile's points are). Run it with the server otherwise idle.

    Why, beside :func:`probe_s`: the probe is a cache-resident matrix product and sweep; on this
    VM the memory system's speed drifts apart from the cores' (docs/serving.md: beside a memory
    hog a one-stream decode step +29%, the probe +10%, a 128 MB sweep +5%), and the one-stream
    decode is the commonest step of a light load. No probe built so far behaved like it, so the
    server is asked directly, with a request none of the compared ones is."""
    import json
    import urllib.request

    from llm_lb_gym.serve.llamacpp_sim import schedstat_s

    body = {"model": model, "prompt": " ".join(["tok"] * CHECK_PROMPT_TOKENS), "max_tokens": CHECK_OUTPUT_TOKENS,
            "ignore_eos": True, "cache_prompt": False, "temperature": 0.0}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    before = schedstat_s(pid)
    with urllib.request.urlopen(req, timeout=120) as r:
        t = json.loads(r.read())["timings"]
    after = schedstat_s(pid)
    run, wait = after[0] - before[0], after[1] - before[1]
    share = run / (run + wait) if run > 0 else 1.0
    if int(t["prompt_n"]) != CHECK_PROMPT_TOKENS or int(t["predicted_n"]) != CHECK_OUTPUT_TOKENS:
        raise RuntimeError(f"server check at {url}: {t['prompt_n']} prompt and {t['predicted_n']} generated tokens "
                           f"where {CHECK_PROMPT_TOKENS} and {CHECK_OUTPUT_TOKENS} were asked (is cache_prompt "
                           f"honoured?)")
    return (float(t["prompt_ms"]) / 1e3 / CHECK_PROMPT_TOKENS * share,
            float(t["predicted_ms"]) / 1e3 / CHECK_OUTPUT_TOKENS * share)


def check_footing(prefill_s: float, decode_s: float, ref_prefill_s: float, ref_decode_s: float) -> tuple[float, float]:
    """(compute factor, extra seconds per iteration) of a server check against a reference check:
    prompts follow the cores (``prefill_s / ref_prefill_s``); what a one-stream decode step
    changed beyond that is a cost per iteration (the weight read;
    ``serve/llamacpp_sim.phase_scaled_latency`` says why)."""
    compute = prefill_s / ref_prefill_s
    return compute, decode_s - ref_decode_s * compute


def best_probe_s(n: int = 5) -> float:
    """The least of ``n`` probes (the machine's speed at its least contended moment now)."""
    return min(probe_s() for _ in range(n))


class ProbeSampler:
    """Probes every ``interval_s`` on a thread of its own while a replay runs (about 1% of a
    core), so the execution slowdown is measured over the replay itself."""

    def __init__(self, interval_s: float = 1.0):
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(probe_s())

    def __enter__(self) -> "ProbeSampler":
        self.samples.append(probe_s())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def median_s(self) -> float:
        return float(np.median(self.samples))
