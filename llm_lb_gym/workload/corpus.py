"""A text workload: requests drawn from a corpus of real prompts with real responses.

The only workload whose requests carry their prompt text, so the environment can route on what
a trained text predictor (``predictor="transformer"`` or ``"light"``) says about each prompt.
Prompt and decode tokens are the corpus's WordPiece counts of the real prompt and response,
and the task type is attached (``task_names`` = the sorted task types of the chosen rows).

By default episodes come from the held-out ``test`` split, split by prompt hash exactly as
``llm_lb_gym.experiments.train_predictor`` splits it, so a predictor is never scored in simulation on
prompts it was trained on. Rows are drawn without replacement (cycling through fresh
permutations when an episode is larger than the split); arrivals come from a synthetic process
(Poisson at 20 req/s unless given), since a corpus has no timestamps.
"""

from __future__ import annotations

import dataclasses

import os
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np

from .._validate import ConfigError, check_choice, check_int, check_range
from ..data.corpus import DEFAULT_CORPUS, SPLITS, Corpus, read_corpus
from ..data.store import locate
from ..limits import MAX_TOKENS
from .arrivals import ArrivalProcess, PoissonArrivals
from .batch import RequestBatch
from .filters import RowFilterReport, cap_rows


@lru_cache(maxsize=8)
def _cached_corpus(path: str, size: int, mtime_ns: int) -> Corpus:
    return read_corpus(path)


def load_corpus(path: str | os.PathLike) -> Corpus:
    """``data.read_corpus`` cached per (file, size, mtime): resets never re-read it."""
    p = Path(path).expanduser().resolve()
    stat = p.stat()
    return _cached_corpus(str(p), stat.st_size, stat.st_mtime_ns)


@dataclass(frozen=True)
class _Rows:
    prompts: tuple[str, ...]
    prompt_tokens: np.ndarray
    decode_tokens: np.ndarray
    task_id: np.ndarray
    task_names: tuple[str, ...]
    report: RowFilterReport | None = None


@dataclass(frozen=True)
class CorpusWorkload:
    """Episodes of real prompts (with text) from a JSONL prompt/response corpus."""

    path: str | None = None
    """Corpus file; None: the registered ``prompts_responses`` dataset (``data.locate``)."""
    arrivals: ArrivalProcess = field(default_factory=lambda: PoissonArrivals(20.0))
    """Arrival process (a corpus has no timestamps)."""
    task_filter: tuple[str, ...] | None = None
    """Keep only these task types (None: all)."""
    split: str = "test"
    """"test" (held out from predictor training), "train" or "all"."""
    test_fraction: float = 0.2
    """Held-out share of prompts; must match the predictor's training split."""
    max_prompt_tokens: int | None = None
    """Drop rows with longer prompts (the paper keeps prompts of at most 1,000 tokens)."""
    max_context_tokens: int | None = None
    """Drop rows whose prompt fills it; clip decode to the rest (None: no cap)."""

    def __post_init__(self) -> None:
        path = locate(DEFAULT_CORPUS) if self.path is None else Path(self.path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"corpus file not found: {path}")
        object.__setattr__(self, "path", str(path))
        check_choice("split", self.split, SPLITS)
        check_range("test_fraction", self.test_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
        if not hasattr(self.arrivals, "times_s"):
            raise ConfigError(f"arrivals={self.arrivals!r} must be an arrival process with times_s")
        if self.task_filter is not None:
            object.__setattr__(self, "task_filter", tuple(self.task_filter))
        if self.max_prompt_tokens is not None:
            check_int("max_prompt_tokens", self.max_prompt_tokens, 1, MAX_TOKENS)
        if self.max_context_tokens is not None:
            check_int("max_context_tokens", self.max_context_tokens, 2, MAX_TOKENS)
        _ = self._rows  # read and filter now: a bad file or filter fails at construction

    @property
    def task_names(self) -> tuple[str, ...]:
        return self._rows.task_names

    @cached_property
    def _rows(self) -> _Rows:
        corpus = load_corpus(self.path).split(self.split, self.test_fraction)
        keep = np.ones(len(corpus), dtype=bool)
        before, limits = {}, {}
        if self.task_filter is not None:
            known = set(corpus.task_names)
            unknown = [t for t in self.task_filter if t not in known]
            if unknown:
                raise ConfigError(f"task_filter has unknown task(s) {', '.join(unknown)}; "
                                  f"allowed: {', '.join(corpus.task_names)}")
            keep &= np.isin(np.asarray(corpus.task_types), list(self.task_filter))
            before["task_filter"] = int((~keep).sum())
            limits["task_filter"] = list(self.task_filter)
        prompt = corpus.prompt_tokens
        decode = np.maximum(corpus.decode_tokens, 1)  # the simulator generates at least one token
        keep, decode, report = cap_rows(f"{self.path} (split {self.split})", prompt, decode, keep,
                                        self.max_prompt_tokens, self.max_context_tokens,
                                        before, limits)
        idx = np.flatnonzero(keep)
        if not len(idx):
            raise ConfigError(f"no rows of {self.path} (split={self.split}) pass task_filter="
                              f"{self.task_filter} and the token caps")
        tasks = [corpus.task_types[i] for i in idx]
        names = tuple(sorted(set(tasks)))
        index = {t: i for i, t in enumerate(names)}
        return _Rows(tuple(corpus.prompts[i] for i in idx), prompt[idx], decode[idx],
                     np.array([index[t] for t in tasks], np.int64), names, report)

    @property
    def row_filters(self) -> RowFilterReport:
        """What ``task_filter`` and the token caps removed from the split (``filters.py``)."""
        return self._rows.report

    def calibration_sample(self, rng: np.random.Generator, num_requests: int) -> RequestBatch:
        """History for a predictor's calibration: the training split (all rows with split=all)."""
        if self.split == "test":
            return dataclasses.replace(self, split="train").sample(rng, num_requests)
        return self.sample(rng, num_requests)

    def sample(self, rng: np.random.Generator, num_requests: int) -> RequestBatch:
        check_int("num_requests", num_requests, 0)
        n = int(num_requests)
        rows = self._rows
        m = len(rows.prompts)
        if n <= m:
            idx = rng.choice(m, size=n, replace=False)
        else:
            idx = np.concatenate([rng.permutation(m) for _ in range(-(-n // m))])[:n]
        times = self.arrivals.times_s(rng, n)
        return RequestBatch.from_arrays(
            times, rows.prompt_tokens[idx], rows.decode_tokens[idx], rows.task_id[idx],
            rows.task_names, texts=[rows.prompts[i] for i in idx],
            meta={"workload": "corpus", "path": self.path, "split": self.split, "rows": m})
