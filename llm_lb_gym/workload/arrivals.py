"""Arrival processes: when the requests of an episode reach the router.

Every process returns ``n`` non-decreasing times in seconds with the first request at exactly
0 s: an episode starts when its first request arrives, so no policy is charged for an idle
lead-in whose length would only be noise. The paper uses Poisson-like arrivals (20 req/s on
V100); production traces are burstier, which ``GammaArrivals`` (cv > 1) and ``TraceArrivals``
(replayed timestamps) reproduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from .._validate import ConfigError, check_choice, check_int, check_range
from ..limits import CV_RANGE, MIN_RATE_RPS, check_arrival_span

START_CHOICES = ("random", "head")
"""Where a replayed trace window begins: a random row (from the rng) or the first row."""


@runtime_checkable
class ArrivalProcess(Protocol):
    def times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` sorted float64 arrival times in seconds, the first at 0."""
        ...


def _times_from_gaps(gaps_s: np.ndarray) -> np.ndarray:
    """Arrival times 0, g1, g1+g2, ... from the ``n - 1`` gaps between consecutive requests."""
    times = np.empty(len(gaps_s) + 1, dtype=np.float64)
    times[0] = 0.0
    np.cumsum(gaps_s, out=times[1:])
    return times


def _check_n(n: int) -> None:
    check_int("num_requests", n, 0)


def _within_limit(process, times: np.ndarray) -> np.ndarray:
    """``times`` after checking the last one against ``limits.MAX_ARRIVAL_S``."""
    check_arrival_span(times, f"{type(process).__name__}(rate_rps={process.rate_rps!r}) with "
                       f"{len(times)} requests",
                       "raise rate_rps (the env's arrival_rate_rps) or lower num_requests")
    return times


@dataclass(frozen=True)
class PoissonArrivals:
    """Memoryless arrivals: exponential inter-arrival times with mean ``1 / rate_rps``."""

    rate_rps: float = 20.0
    """Mean arrival rate in requests per second (the paper's V100 setting: 20)."""

    def __post_init__(self) -> None:
        check_range("rate_rps", self.rate_rps, MIN_RATE_RPS)

    def times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        _check_n(n)
        if n == 0:
            return np.empty(0, dtype=np.float64)
        return _within_limit(self, _times_from_gaps(rng.exponential(1.0 / self.rate_rps, size=n - 1)))


@dataclass(frozen=True)
class GammaArrivals:
    """Renewal arrivals with gamma inter-arrival times of a given coefficient of variation.

    ``cv`` is std/mean of the gaps: 1 is Poisson, above 1 bursty (many short gaps, a few long
    ones: production LLM traffic), below 1 smoother than Poisson. Shape ``1/cv**2``, scale
    ``cv**2 / rate_rps`` keep the mean gap at ``1 / rate_rps`` for every cv.
    """

    rate_rps: float = 20.0
    """Mean arrival rate in requests per second."""
    cv: float = 1.0
    """Coefficient of variation of the inter-arrival times (> 0)."""

    def __post_init__(self) -> None:
        check_range("rate_rps", self.rate_rps, MIN_RATE_RPS)
        check_range("cv", self.cv, *CV_RANGE)

    def times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        _check_n(n)
        if n == 0:
            return np.empty(0, dtype=np.float64)
        shape = 1.0 / self.cv**2
        gaps = rng.gamma(shape, 1.0 / (shape * self.rate_rps), size=n - 1)
        return _within_limit(self, _times_from_gaps(gaps))


@dataclass(frozen=True)
class DeterministicArrivals:
    """Evenly spaced arrivals, one every ``1 / rate_rps`` seconds; draws nothing from the rng.

    For golden tests and for isolating routing effects from arrival noise.
    """

    rate_rps: float = 20.0
    """Arrival rate in requests per second."""

    def __post_init__(self) -> None:
        check_range("rate_rps", self.rate_rps, MIN_RATE_RPS)

    def times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        _check_n(n)
        return _within_limit(self, np.arange(n, dtype=np.float64) / self.rate_rps)


def check_timestamps(name: str, timestamps_s: np.ndarray) -> np.ndarray:
    """Return ``timestamps_s`` as a read-only float64 copy after checking it is replayable."""
    ts = np.array(timestamps_s, dtype=np.float64)
    if ts.ndim != 1 or len(ts) == 0:
        raise ConfigError(f"{name} must be a non-empty 1-D sequence of seconds")
    if not np.all(np.isfinite(ts)):
        raise ConfigError(f"{name} must be finite")
    if np.any(np.diff(ts) < 0):
        raise ConfigError(f"{name} must be non-decreasing")
    ts.setflags(write=False)
    return ts


def trace_window(rng: np.random.Generator, timestamps_s: np.ndarray, n: int, start: str,
                 rate_scale: float, source: str = "trace") -> tuple[np.ndarray, np.ndarray]:
    """Pick ``n`` consecutive rows of a sorted trace and their replayed arrival times.

    Returns ``(rows, times_s)``. ``start="head"`` begins at row 0; ``"random"`` draws the first
    row uniformly among those that leave ``n`` rows before the end, so the window needs no seam.
    When ``n`` exceeds the trace, the trace wraps around: it repeats as a periodic extension
    whose period is its span plus one mean gap, so the seam looks like an ordinary gap (and a
    random start may then be any row). Times are shifted to start at 0 and divided by
    ``rate_scale`` (2.0 replays twice as fast); past ``limits.MAX_ARRIVAL_S`` they raise
    ``ArrivalLimitError`` naming ``source``.
    """
    _check_n(n)
    check_choice("start", start, START_CHOICES)
    check_range("rate_scale", rate_scale, MIN_RATE_RPS)
    num_rows = len(timestamps_s)
    if n == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    if n > num_rows and num_rows < 2:
        raise ConfigError(f"cannot wrap a trace of {num_rows} row(s) to {n} requests; need >= 2 rows")
    if start == "head":
        offset = 0
    elif n <= num_rows:
        offset = int(rng.integers(0, num_rows - n + 1))
    else:
        offset = int(rng.integers(0, num_rows))
    position = offset + np.arange(n, dtype=np.int64)
    rows = position % num_rows
    times = timestamps_s[rows].astype(np.float64)
    if n + offset > num_rows:
        span = float(timestamps_s[-1] - timestamps_s[0])
        period = span * num_rows / (num_rows - 1)
        times = times + (position // num_rows) * period
    times = (times - times[0]) / rate_scale
    check_arrival_span(times, f"{source} replayed at rate_scale={rate_scale!r} ({n} requests)",
                       "raise rate_scale or lower num_requests")
    return rows, times


@dataclass(frozen=True, eq=False)
class TraceArrivals:
    """Replay recorded arrival timestamps, compressed or stretched by ``rate_scale``.

    Useful to pair a real trace's burstiness with another dataset's lengths (for example the
    Azure timestamps with ShareGPT lengths). Window and wrap-around rules: ``trace_window``.
    """

    timestamps_s: np.ndarray
    """Recorded arrival times in seconds (any origin), non-decreasing."""
    rate_scale: float = 1.0
    """Speed-up of the replay: 2.0 halves every gap (twice the rate), 0.5 doubles them."""
    start: str = "random"
    """First replayed row: "random" (from the rng) or "head"."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "timestamps_s", check_timestamps("timestamps_s", self.timestamps_s))
        check_range("rate_scale", self.rate_scale, MIN_RATE_RPS)
        check_choice("start", self.start, START_CHOICES)

    def times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return trace_window(rng, self.timestamps_s, n, self.start, self.rate_scale)[1]

    @property
    def mean_rate_rps(self) -> float:
        """Average arrival rate of the replay (rows over span, times ``rate_scale``)."""
        span = float(self.timestamps_s[-1] - self.timestamps_s[0])
        return float("inf") if span == 0 else (len(self.timestamps_s) - 1) / span * self.rate_scale
