"""The unit every workload produces: one episode's requests as parallel arrays.

Arrays rather than objects because episodes hold thousands of requests and the simulator reads
them column-wise; a ``RequestBatch`` is immutable once built so the same batch can be replayed
to every policy of an evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..limits import check_arrival_span


@dataclass(frozen=True)
class RequestBatch:
    """One episode's requests, sorted by arrival time."""

    arrival_s: np.ndarray
    """float64, non-decreasing arrival times in seconds from the episode start, at most
    ``limits.MAX_ARRIVAL_S``."""
    prompt_tokens: np.ndarray
    """int64 >= 1, prompt length of each request."""
    decode_tokens: np.ndarray
    """int64 >= 1, true output length (the simulator generates exactly this many tokens)."""
    task_id: np.ndarray
    """int64 index into ``task_names`` (the task type or application of each request)."""
    task_names: tuple[str, ...] = ("default",)
    texts: tuple[str, ...] | None = None
    """Prompt texts, when the workload has them (the transformer predictor reads them)."""
    meta: dict = field(default_factory=dict)
    """Free-form provenance (source file, rate scale, ...)."""

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "decode_tokens", "task_id"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"RequestBatch.{name} has {len(getattr(self, name))} rows, expected {n}")
        if self.texts is not None and len(self.texts) != n:
            raise ValueError(f"RequestBatch.texts has {len(self.texts)} rows, expected {n}")
        if n:
            if np.any(np.diff(self.arrival_s) < 0):
                raise ValueError("RequestBatch.arrival_s must be non-decreasing")
            if not self.arrival_s[0] >= 0:
                raise ValueError("RequestBatch.arrival_s must be >= 0")
            source = self.meta.get("path") or self.meta.get("workload") or "RequestBatch"
            check_arrival_span(self.arrival_s, f"{source}: RequestBatch.arrival_s")
            if self.prompt_tokens.min() < 1 or self.decode_tokens.min() < 1:
                raise ValueError("RequestBatch prompt_tokens and decode_tokens must be >= 1")
            if self.task_id.min() < 0 or self.task_id.max() >= len(self.task_names):
                raise ValueError("RequestBatch.task_id out of range of task_names")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @staticmethod
    def from_arrays(arrival_s, prompt_tokens, decode_tokens, task_id=None,
                    task_names=("default",), texts=None, meta=None) -> "RequestBatch":
        """Build a batch, coercing dtypes and sorting by arrival (stable, so ties keep order)."""
        arrival_s = np.asarray(arrival_s, dtype=np.float64)
        order = np.argsort(arrival_s, kind="stable")
        n = len(arrival_s)
        task_id = np.zeros(n, np.int64) if task_id is None else np.asarray(task_id, np.int64)
        return RequestBatch(
            arrival_s=arrival_s[order],
            prompt_tokens=np.asarray(prompt_tokens, np.int64)[order],
            decode_tokens=np.asarray(decode_tokens, np.int64)[order],
            task_id=task_id[order],
            task_names=tuple(task_names),
            texts=None if texts is None else tuple(texts[i] for i in order),
            meta=dict(meta or {}),
        )
