"""Replay a request trace as episodes: windows of consecutive rows, or random rows of lengths.

Timestamped traces (Azure, Mooncake, BurstGPT) keep their burstiness: an episode is ``n``
consecutive rows replayed at their recorded times (divided by ``rate_scale``), starting at a
random row (``start="random"``, from the rng) or the first (``"head"``); past the end the trace
wraps around as a periodic extension (``arrivals.trace_window``). Given an arrival process
instead, the window's lengths get synthetic arrival times. Length-only files have no order
worth keeping: an episode draws ``n`` distinct rows at random (with ``start="head"``: the
first ``n``), cycling through fresh permutations when ``n`` exceeds the file, and always needs
an arrival process.

Caps mirror the paper's filtering: rows whose prompt exceeds ``max_prompt_tokens`` or leaves no
room in ``max_context_tokens`` are dropped before windowing (their arrival simply does not
happen); decode is clipped to the context left after the prompt, as a server stops generating
at its context limit. ``row_filters`` counts both, by reason (``filters.RowFilterReport``).

Splits (``split``: "all", "train", "test"; ``test_fraction``) hold rows out of tuning, fixed by
the file alone: a timestamped trace's last ``test_fraction`` of rows in time are ``test`` (the
future a router trained on the past meets); a length-only file's ``test`` rows are a fixed
pseudo-random share (``split_rows``). The split is taken on the file's rows before the caps,
so changing a cap never moves a row across it. ``calibration_sample`` draws from the training
rows: a predictor is calibrated on the past, never on the episodes it is judged on.

Parsing is cached per (file, size, mtime, format, zero policy) in-process, so resetting an
environment never re-reads a 30k-row file.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np

from .._validate import ConfigError, check_choice, check_int, check_range
from ..data.formats import TRACE_FORMATS, ZERO_TOKEN_POLICIES
from ..data.traces import TraceData, read_trace
from ..limits import MAX_TOKENS, MIN_RATE_RPS
from .arrivals import START_CHOICES, ArrivalProcess, trace_window
from .batch import RequestBatch
from .filters import RowFilterReport, cap_rows


SPLITS = ("all", "train", "test")
SPLIT_SEED = 7919
"""Seed of the fixed permutation that splits length-only files (the file decides, not a run)."""


def split_rows(num_rows: int, timestamped: bool, split: str, test_fraction: float) -> np.ndarray:
    """Boolean mask of the rows of ``split`` among ``num_rows`` file rows (see the module doc)."""
    if split == "all":
        return np.ones(num_rows, dtype=bool)
    n_test = int(round(test_fraction * num_rows))
    if timestamped:
        test = np.arange(num_rows) >= num_rows - n_test
    else:
        test = np.random.default_rng(SPLIT_SEED).permutation(num_rows) < n_test
    return test if split == "test" else ~test


@lru_cache(maxsize=32)
def _cached_read(path: str, size: int, mtime_ns: int, format: str,
                 zero_tokens: str | None) -> TraceData:
    return read_trace(path, format, zero_tokens)


def load_trace(path: str | os.PathLike, format: str, zero_tokens: str | None = None) -> TraceData:
    """``read_trace`` with an in-process cache keyed by the file's identity and contents' stamp."""
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise FileNotFoundError(f"trace file not found: {p}")
    stat = p.stat()
    return _cached_read(str(p), stat.st_size, stat.st_mtime_ns, format, zero_tokens)


@dataclass(frozen=True)
class _Rows:
    """The trace rows left after the caps, as arrays ready for indexing."""

    arrival_s: np.ndarray | None
    prompt_tokens: np.ndarray
    decode_tokens: np.ndarray
    task_id: np.ndarray
    filtered_rows: int
    prefix_hashes: tuple | None = None
    report: RowFilterReport | None = None


@dataclass(frozen=True)
class TraceWorkload:
    """Episodes drawn from a trace file (formats: ``data.TRACE_FORMATS``)."""

    path: str
    """The trace file."""
    format: str
    """One of azure, lengths, mooncake, burstgpt."""
    rate_scale: float = 1.0
    """Replay speed-up of recorded timestamps (2.0 = twice the rate); 1.0 with ``arrivals``."""
    start: str = "random"
    """First row of a window: "random" (from the rng) or "head" (row 0)."""
    arrivals: ArrivalProcess | None = None
    """Synthetic arrival process; None replays the trace's timestamps (required for lengths)."""
    max_prompt_tokens: int | None = None
    """Drop rows with longer prompts (None: no cap)."""
    max_context_tokens: int | None = None
    """Drop rows whose prompt fills it; clip decode to the rest (None: no cap)."""
    zero_tokens: str | None = None
    """Rows with 0 tokens: "error" or "drop"; None = the format's default (drop for burstgpt)."""
    task_name: str | None = None
    """Name of the single task of a one-application trace (default: the file's stem)."""
    dataset: str | None = None
    """The registered dataset ``path`` holds (``data.DATASETS``); None for a file of your own."""
    split: str = "all"
    """Which rows episodes come from: "all", "train" or "test" (``split_rows``)."""
    test_fraction: float = 0.3
    """Share of the file's rows in the ``test`` split, in (0, 1)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", str(self.path))
        check_choice("format", self.format, TRACE_FORMATS)
        check_choice("split", self.split, SPLITS)
        check_range("test_fraction", self.test_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
        check_range("rate_scale", self.rate_scale, MIN_RATE_RPS)
        check_choice("start", self.start, START_CHOICES)
        if self.zero_tokens is not None:
            check_choice("zero_tokens", self.zero_tokens, ZERO_TOKEN_POLICIES)
        if self.arrivals is not None and not hasattr(self.arrivals, "times_s"):
            raise ConfigError(f"arrivals={self.arrivals!r} must be an arrival process with times_s")
        if self.arrivals is not None and self.rate_scale != 1.0:
            raise ConfigError("rate_scale applies to recorded timestamps; with arrivals=... "
                              "set the process's rate instead (allowed: rate_scale=1.0)")
        if self.max_prompt_tokens is not None:
            check_int("max_prompt_tokens", self.max_prompt_tokens, 1, MAX_TOKENS)
        if self.max_context_tokens is not None:
            check_int("max_context_tokens", self.max_context_tokens, 2, MAX_TOKENS)
        data = self.data  # parse now: a bad path or file fails at construction
        if not data.has_timestamps and self.arrivals is None:
            raise ConfigError(f"format={self.format!r} has no timestamps; pass arrivals=... "
                              "(e.g. PoissonArrivals(20.0))")
        if self.task_name is not None and len(data.task_names) != 1:
            raise ConfigError(f"task_name applies to single-task traces; {self.path} has tasks "
                              f"{', '.join(data.task_names)}")
        if len(self._rows.prompt_tokens) == 0:
            raise ConfigError(f"no rows of {self.path} fit max_prompt_tokens="
                              f"{self.max_prompt_tokens} and max_context_tokens={self.max_context_tokens}")

    @property
    def data(self) -> TraceData:
        """The parsed file (shared, read-only, cached per process)."""
        return load_trace(self.path, self.format, self.zero_tokens)

    @property
    def task_names(self) -> tuple[str, ...]:
        return (self.task_name,) if self.task_name is not None else self.data.task_names

    @cached_property
    def _rows(self) -> _Rows:
        d = self.data
        zero = {"zero_tokens": d.dropped_zero_rows} if d.dropped_zero_rows else {}
        arrival, prompt, decode, task = d.arrival_s, d.prompt_tokens, d.decode_tokens, d.task_id
        hashes, source = d.prefix_hashes, self.path
        if self.split != "all":   # the split's rows only: the report counts within the split
            part = np.flatnonzero(split_rows(len(d), d.has_timestamps, self.split, self.test_fraction))
            arrival = None if arrival is None else arrival[part]
            prompt, decode, task = prompt[part], decode[part], task[part]
            hashes = None if hashes is None else tuple(hashes[i] for i in part)
            source = f"{self.path} (split {self.split})"
        keep, decode, report = cap_rows(
            source, prompt, decode, np.ones(len(prompt), dtype=bool),
            self.max_prompt_tokens, self.max_context_tokens, zero, rows_before=d.dropped_zero_rows)
        if keep.all():
            return _Rows(arrival, prompt, decode, task, 0, hashes, report)
        arrival = None if arrival is None else arrival[keep]
        hashes = None if hashes is None else tuple(h for h, k in zip(hashes, keep) if k)
        return _Rows(arrival, prompt[keep], decode[keep], task[keep], int((~keep).sum()), hashes,
                     report)

    @property
    def mean_rate_rps(self) -> float | None:
        """Mean arrival rate of the rows kept (recorded times, before ``rate_scale``); None for a
        length-only file. What a condition's load divides by (``suite/condition.py``)."""
        t = self._rows.arrival_s
        if t is None or len(t) < 2 or t[-1] <= t[0]:
            return None
        return float((len(t) - 1) / (t[-1] - t[0]))

    def calibration_sample(self, rng: np.random.Generator, num_requests: int) -> RequestBatch:
        """History for a predictor's calibration: the training rows (all rows without a split)."""
        if self.split == "test":
            return dataclasses.replace(self, split="train").sample(rng, num_requests)
        return self.sample(rng, num_requests)

    @property
    def row_filters(self) -> RowFilterReport:
        """What the caps (and the reader's ``zero_tokens="drop"``) removed from the file, by
        reason; the experiments print it and record it (``workload/filters.py``)."""
        return self._rows.report

    def _length_rows(self, rng: np.random.Generator, n: int, num_rows: int) -> np.ndarray:
        """Row indices for a length-only file: distinct random rows, or the head, cycling."""
        if self.start == "head":
            return np.arange(n, dtype=np.int64) % num_rows
        if n <= num_rows:
            return rng.choice(num_rows, size=n, replace=False).astype(np.int64)
        cycles = -(-n // num_rows)
        return np.concatenate([rng.permutation(num_rows) for _ in range(cycles)])[:n]

    def sample(self, rng: np.random.Generator, num_requests: int) -> RequestBatch:
        check_int("num_requests", num_requests, 0)
        n = int(num_requests)
        rows = self._rows
        num_rows = len(rows.prompt_tokens)
        if rows.arrival_s is not None:
            idx, times = trace_window(rng, rows.arrival_s, n, self.start, self.rate_scale,
                                      self.path)
        else:
            idx, times = self._length_rows(rng, n, num_rows), None
        if self.arrivals is not None:
            times = self.arrivals.times_s(rng, n)
        return RequestBatch.from_arrays(
            times, rows.prompt_tokens[idx], rows.decode_tokens[idx], rows.task_id[idx],
            self.task_names,
            meta={"workload": "trace", "path": self.path, "dataset": self.dataset,
                  "format": self.format,
                  "rate_scale": self.rate_scale, "first_row": int(idx[0]) if n else None,
                  "wrapped": n > num_rows, "rows": num_rows,
                  "filtered_rows": rows.filtered_rows,
                  "dropped_zero_rows": self.data.dropped_zero_rows},
            prefix_hashes=None if rows.prefix_hashes is None else [rows.prefix_hashes[i] for i in idx],
            hash_block_tokens=self.data.hash_block_tokens)
