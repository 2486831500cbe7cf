"""The API server's output work as it streams: the CPU it takes from the frontend's other jobs.

Why: a server detokenizes each token and writes its stream chunk when the token is made, so
that work (``FrontendModel.output_token_s`` per token after the first) is spread over the
decode iterations, a few microseconds per token in a step of milliseconds. Booked instead as
one job per request from its first token on (the model until 2026-12-07), a request's whole
output work ran at once: 1,023 tokens x 3.8 us = 3.9 ms of CPU right after its first token,
and in a closed loop of 16 such requests sent together 62 ms of it, just when the next
requests' inputs needed the CPU, which the real server does not do (silybench's 128 / 1,024
runs, docs/calibration.md).

The model: a decode iteration ``[s, s + tau)`` in which ``n`` requests each get a token brings
``w n`` seconds of output work (``w = output_token_s``), done as a fluid over that iteration:
it takes the share ``min(1, w n / tau)`` of the CPU, and the frontend's jobs (inputs, first
chunks) share what is left (``frontend.py``). Work beyond the CPU (``w n > tau``: an output
backlog) is not lost: what an iteration could not do, ``w n - tau``, becomes a job of its own at
the iteration's end, sharing the CPU with the others, and a response whose last token is made
while such a job is open reaches the client when the last one reported by then is done (at the
fitted ``w``, 3.8 us, a backlog needs over 250k tokens per second). The delay of tokens before
the last is not modelled (the streamed ITL is the engine's). Prefill-only iterations stream nothing; a first
token's chunk is the frontend's own job.

The engine reports runs of decode iterations as it runs them (``add``): iteration ``j`` of a run
starts at ``t0 + j a + c j (j - 1) / 2`` and lasts ``a + c j`` (a decode stretch in closed form,
``engine.py``), so the free CPU time over any interval is O(1) per run (:func:`_free_to`) and so
is its inverse (:func:`_time_of_free`): the frontend's processor sharing stays event-driven.
"""

from __future__ import annotations

import math
from collections import deque

from .iteration_timing import iterations_before

INF = math.inf


class OutputStream:
    """Runs of decode iterations with their output work, in time order; the free CPU time."""

    def __init__(self, per_token_s: float):
        self.w = per_token_s
        # (start S, end E, a', c, m, wn, m*): local iteration m = 0 .. m - 1 starts at
        # S + m a' + c m (m - 1) / 2; m* = the first whose duration a' + c m reaches wn.
        self.runs: deque = deque()
        self.end = -INF   # the end of the last run reported

    def add(self, t0: float, a: float, c: float, j0: int, j1: int, n: int) -> list[tuple[float, float]]:
        """Iterations ``j0 .. j1 - 1`` of a run starting at ``t0``, ``n`` tokens each; returns the
        backlog jobs, (time, work): each iteration's output work beyond its duration, at its end
        (none unless ``w n`` exceeds an iteration; one per such iteration, as the reference has)."""
        if j1 <= j0 or n <= 0:
            return []
        S = t0 + j0 * a + c * j0 * (j0 - 1) / 2
        a1 = a + c * j0
        m = j1 - j0
        E = S + m * a1 + c * m * (m - 1) / 2
        assert S >= self.end - 1e-9 * max(1.0, abs(S)), f"output stream: a run at {S} reported before {self.end}"
        wn = self.w * n
        if a1 >= wn:
            mstar = 0
        elif c <= 0.0:
            mstar = m
        else:
            mstar = min(m, math.ceil((wn - a1) / c))
            while mstar > 0 and a1 + c * (mstar - 1) >= wn:
                mstar -= 1
            while mstar < m and a1 + c * mstar < wn:
                mstar += 1
        self.runs.append((S, E, a1, c, m, wn, mstar))
        self.end = E
        if not mstar:
            return []
        run = self.runs[-1]
        return [(_start(run, k + 1), wn - (a1 + c * k)) for k in range(mstar)]

    def prune(self, t: float) -> None:
        """Forget the runs over by ``t``."""
        runs = self.runs
        while runs and runs[0][1] <= t:
            runs.popleft()

    def free(self, x: float, y: float) -> float:
        """CPU seconds left to the frontend's jobs in ``[x, y]`` (``x <= y``)."""
        out = y - x
        for run in self.runs:
            S, E = run[0], run[1]
            if S >= y:
                break
            if E <= x:
                continue
            lo, hi = (x if x > S else S), (y if y < E else E)
            out -= (hi - lo) - (_free_to(run, hi) - _free_to(run, lo))
        return out

    def when(self, x: float, amount: float) -> float:
        """The time at which the jobs have had ``amount`` CPU seconds from ``x`` on (runs not
        yet reported count as free: a lower bound until they are)."""
        t = x
        for run in self.runs:
            S, E = run[0], run[1]
            if E <= t:
                continue
            if S > t:   # free time before the run
                if t + amount <= S:
                    return t + amount
                amount -= S - t
                t = S
            have = _free_to(run, E) - _free_to(run, t)
            if have >= amount:
                return _time_of_free(run, _free_to(run, t) + amount)
            amount -= have
            t = E
        return t + amount


def _start(run, m: int) -> float:
    S, _, a1, c = run[0], run[1], run[2], run[3]
    return S + m * a1 + c * m * (m - 1) / 2


def _free_to(run, t: float) -> float:
    """Free CPU seconds from the run's start to ``t`` (inside the run)."""
    S, E, a1, c, m, wn, mstar = run
    if t <= S:
        return 0.0
    if m == 1 or (c == 0.0 and mstar == 0):   # one rate over the whole run
        return (t - S) * (1.0 - wn / a1) if a1 > wn else 0.0
    if c > 0.0:
        k = iterations_before(S, a1, c, t) - 1   # the iteration t falls in
    else:
        k = int((t - S) // a1) if a1 > 0.0 else 0
        while k > 0 and _start(run, k) > t:
            k -= 1
        while k + 1 < m and _start(run, k + 1) <= t:
            k += 1
    if k >= m:
        k = m - 1
    sk = _start(run, k)
    tau = a1 + c * k
    part = (t - sk) * (1.0 - wn / tau) if tau > wn else 0.0
    if k <= mstar:
        return part
    q = k - mstar   # whole iterations after m*, each leaving tau - wn free
    return q * (a1 + c * mstar - wn) + c * q * (q - 1) / 2 + part


def _time_of_free(run, A: float) -> float:
    """The time inside the run at which its free CPU seconds from its start reach ``A``
    (``0 < A <= _free_to(run, E)``)."""
    S, E, a1, c, m, wn, mstar = run
    b = a1 + c * mstar - wn   # free time of iteration m*; iteration m* + q leaves b + c q
    if b <= 0.0 and c <= 0.0:
        return E
    # q = the iteration after m* in which the free time reaches A: the last q whose start
    # (in free time: q b + c q (q - 1) / 2) is below A.
    q = iterations_before(0.0, b, c, A) - 1 if b > 0.0 or c > 0.0 else 0
    k = min(mstar + q, m - 1)
    q = k - mstar
    before = q * b + c * q * (q - 1) / 2
    tau = a1 + c * k
    if tau <= wn:   # (float edge) no free time in it: the next iteration's start
        return _start(run, k + 1) if k + 1 < m else E
    t = _start(run, k) + (A - before) / (1.0 - wn / tau)
    return t if t < E else E
