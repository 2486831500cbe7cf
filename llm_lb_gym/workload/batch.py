"""The unit every workload produces: one episode's requests as parallel arrays.

Arrays rather than objects because episodes hold thousands of requests and the simulator reads
them column-wise; a ``RequestBatch`` is immutable once built so the same batch can be replayed
to every policy of an evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..limits import MAX_TOKENS, check_arrival_span
from ..sim.request import check_hash_chains


@dataclass(frozen=True)
class RequestBatch:
    """One episode's requests, sorted by arrival time."""

    arrival_s: np.ndarray
    """float64, non-decreasing arrival times in seconds from the episode start, at most
    ``limits.MAX_ARRIVAL_S``."""
    prompt_tokens: np.ndarray
    """int64 in [1, ``limits.MAX_TOKENS``], prompt length of each request."""
    decode_tokens: np.ndarray
    """int64 in [1, ``limits.MAX_TOKENS``], true output length (the simulator generates exactly
    this many tokens)."""
    task_id: np.ndarray
    """int64 index into ``task_names`` (the task type or application of each request)."""
    task_names: tuple[str, ...] = ("default",)
    texts: tuple[str, ...] | None = None
    """Prompt texts, when the workload has them (the transformer predictor reads them)."""
    meta: dict = field(default_factory=dict)
    """Free-form provenance (source file, rate scale, ...)."""
    prefix_hashes: tuple | None = None
    """Per request a tuple of chained hash ids of its prompt's blocks of ``hash_block_tokens``
    tokens (id i names tokens [0, (i+1) * hash_block_tokens); equal ids = equal prefixes), or
    None; read by engines with prefix caching. None for the whole batch: no prefix data."""
    hash_block_tokens: int = 0
    """Tokens per hash block (Mooncake traces: 512); a multiple of the engine's block size."""

    def __post_init__(self) -> None:
        # Columns as the simulator reads them, whoever built the batch: lists and float arrays
        # of whole numbers are converted, fractional or non-numeric counts are an error (as in
        # from_arrays and the trace readers), not truncated by the engine.
        for name in ("prompt_tokens", "decode_tokens", "task_id"):
            object.__setattr__(self, name, _counts(name, getattr(self, name)))
        object.__setattr__(self, "arrival_s", _times(self.arrival_s))
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "decode_tokens", "task_id"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"RequestBatch.{name} has {len(getattr(self, name))} rows, expected {n}")
        if self.texts is not None and len(self.texts) != n:
            raise ValueError(f"RequestBatch.texts has {len(self.texts)} rows, expected {n}")
        if self.prefix_hashes is not None:
            if len(self.prefix_hashes) != n:
                raise ValueError(f"RequestBatch.prefix_hashes has {len(self.prefix_hashes)} rows, "
                                 f"expected {n}")
            if not (isinstance(self.hash_block_tokens, (int, np.integer)) and self.hash_block_tokens >= 1):
                raise ValueError(f"RequestBatch.hash_block_tokens={self.hash_block_tokens!r} must be "
                                 "an integer >= 1 when prefix_hashes are given")
            source = self.meta.get("path") or self.meta.get("workload") or "RequestBatch"
            check_hash_chains(self.prefix_hashes, f"{source}: RequestBatch.prefix_hashes")
        if n:
            if np.any(np.diff(self.arrival_s) < 0):
                raise ValueError("RequestBatch.arrival_s must be non-decreasing")
            if not self.arrival_s[0] >= 0:
                raise ValueError("RequestBatch.arrival_s must be >= 0")
            source = self.meta.get("path") or self.meta.get("workload") or "RequestBatch"
            check_arrival_span(self.arrival_s, f"{source}: RequestBatch.arrival_s")
            if self.prompt_tokens.min() < 1 or self.decode_tokens.min() < 1:
                raise ValueError("RequestBatch prompt_tokens and decode_tokens must be >= 1")
            if max(self.prompt_tokens.max(), self.decode_tokens.max()) > MAX_TOKENS:
                raise ValueError(f"RequestBatch prompt_tokens and decode_tokens must be <= "
                                 f"MAX_TOKENS={MAX_TOKENS} (llm_lb_gym.limits)")
            if self.task_id.min() < 0 or self.task_id.max() >= len(self.task_names):
                raise ValueError("RequestBatch.task_id out of range of task_names")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @staticmethod
    def from_arrays(arrival_s, prompt_tokens, decode_tokens, task_id=None,
                    task_names=("default",), texts=None, meta=None, prefix_hashes=None,
                    hash_block_tokens=0) -> "RequestBatch":
        """Build a batch, coercing dtypes and sorting by arrival (stable, so ties keep order)."""
        arrival_s = np.asarray(arrival_s, dtype=np.float64)
        order = np.argsort(arrival_s, kind="stable")
        n = len(arrival_s)
        task_id = np.zeros(n, np.int64) if task_id is None else np.asarray(task_id, np.int64)
        return RequestBatch(
            arrival_s=arrival_s[order],
            prompt_tokens=_counts("prompt_tokens", prompt_tokens)[order],
            decode_tokens=_counts("decode_tokens", decode_tokens)[order],
            task_id=task_id[order],
            task_names=tuple(task_names),
            texts=None if texts is None else tuple(texts[i] for i in order),
            meta=dict(meta or {}),
            prefix_hashes=None if prefix_hashes is None else tuple(
                None if prefix_hashes[i] is None else tuple(prefix_hashes[i]) for i in order),
            hash_block_tokens=int(hash_block_tokens),
        )


def _times(values) -> np.ndarray:
    """float64 arrival times, one dimension."""
    a = np.asarray(values)
    if a.ndim != 1 or (a.dtype.kind not in "fiu" and len(a)):
        raise ValueError(f"RequestBatch.arrival_s must be a one-dimensional sequence of numbers; "
                         f"got {a.ndim} dimension(s) of dtype {a.dtype}")
    return a.astype(np.float64, copy=False)


def _counts(name: str, values) -> np.ndarray:
    """int64 counts (tokens, task ids); a float input must hold whole numbers within
    ``MAX_TOKENS`` (a cast would wrap 1e19 around silently, and truncate 10.5)."""
    a = np.asarray(values)
    if a.ndim != 1:
        raise ValueError(f"RequestBatch.{name} must be one-dimensional; got shape {a.shape}")
    if a.dtype.kind == "u" and len(a) and a.max() > MAX_TOKENS:   # would wrap in the int64 cast
        raise ValueError(f"RequestBatch.{name} must be <= MAX_TOKENS={MAX_TOKENS} (llm_lb_gym.limits)")
    if a.dtype.kind == "f":
        if not (np.all(np.isfinite(a)) and np.all(np.abs(a) <= MAX_TOKENS)
                and np.all(a == np.floor(a))):
            raise ValueError(f"RequestBatch.{name} must be whole numbers <= MAX_TOKENS="
                             f"{MAX_TOKENS} (llm_lb_gym.limits)")
    elif a.dtype.kind not in "iub" and len(a):
        raise ValueError(f"RequestBatch.{name} must be integers; got dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


def poisson_batch(rng: np.random.Generator, n: int, rate_rps: float, prompt_mean: float,
                  decode_mean: float, max_tokens: int = 4000) -> RequestBatch:
    """A quick synthetic batch (geometric lengths, Poisson arrivals) for tests and benches."""
    arr = np.cumsum(rng.exponential(1.0 / rate_rps, n))
    p = np.minimum(rng.geometric(1.0 / prompt_mean, n), max_tokens // 2)
    d = np.minimum(rng.geometric(1.0 / decode_mean, n), max_tokens // 2)
    return RequestBatch.from_arrays(arr, p, d)
