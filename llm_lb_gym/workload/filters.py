"""Row filters of file-backed workloads (traces, corpora), applied once, and their report.

A setting's context cap or length cap removes rows before any episode is sampled: 22-40% of the
held-out Mooncake rows under ``prefix_mooncake``'s ``max_context_tokens``. That changes the
workload as much as a rate does, so every workload that filters keeps a ``RowFilterReport``
(rows read, rows removed per reason, decodes clipped) and the experiments print it and write it
to ``summary.md`` and ``run.json`` beside the request accounting (``experiments/_accounting.py``).
A row removed by several filters is counted once, under the first in ``REASONS`` order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

REASONS = ("zero_tokens", "task_filter", "max_prompt_tokens", "max_context_tokens")
"""Why a row was removed: a 0-token count under ``zero_tokens="drop"`` (the trace reader), a
task not in ``task_filter``, a prompt longer than ``max_prompt_tokens``, a prompt that fills
``max_context_tokens`` (nothing left to generate)."""


@dataclass(frozen=True)
class RowFilterReport:
    """What the filters of one workload did to its file."""

    source: str
    """The file."""
    rows_read: int
    """Data rows in the file (before any filter)."""
    removed: dict = field(default_factory=dict)
    """Reason (one of ``REASONS``) -> rows removed for it; only reasons that apply."""
    limits: dict = field(default_factory=dict)
    """Reason -> the option's value (e.g. ``{"max_context_tokens": 16384}``)."""
    decode_clipped: int = 0
    """Kept rows whose output was clipped to the context left after the prompt."""

    @property
    def rows_removed(self) -> int:
        return int(sum(self.removed.values()))

    @property
    def rows_kept(self) -> int:
        return self.rows_read - self.rows_removed

    def as_dict(self) -> dict:
        """For ``run.json``."""
        return {"source": self.source, "rows_read": self.rows_read, "rows_kept": self.rows_kept,
                "rows_removed": self.rows_removed, "removed": dict(self.removed),
                "limits": dict(self.limits), "decode_clipped": self.decode_clipped}

    def describe(self) -> str:
        """One line, e.g. ``filters removed 3,012 of 12,031 rows (25.0%): 3,012 prompt >=
        max_context_tokens=16384; 41 outputs clipped to the context``."""
        share = 100.0 * self.rows_removed / self.rows_read if self.rows_read else 0.0
        parts = [f"{n:,} {_WHY[r](self.limits.get(r))}" for r, n in self.removed.items() if n]
        text = (f"filters removed {self.rows_removed:,} of {self.rows_read:,} rows of "
                f"{self.source} ({share:.1f}%)")
        text += ": " + "; ".join(parts) if parts else ""
        if self.decode_clipped:
            text += f"; {self.decode_clipped:,} kept rows had their output clipped to the context"
        return text


_WHY = {
    "zero_tokens": lambda v: "with 0 prompt or output tokens (zero_tokens=drop)",
    "task_filter": lambda v: f"of tasks outside task_filter={v}",
    "max_prompt_tokens": lambda v: f"with prompt > max_prompt_tokens={v}",
    "max_context_tokens": lambda v: f"with prompt >= max_context_tokens={v} (no room to generate)",
}


def cap_rows(source: str, prompt: np.ndarray, decode: np.ndarray, keep: np.ndarray,
             max_prompt_tokens: int | None, max_context_tokens: int | None,
             removed_before: dict | None = None, limits_before: dict | None = None,
             rows_before: int = 0) -> tuple[np.ndarray, np.ndarray, RowFilterReport]:
    """Apply the token caps to the rows still in ``keep``: (keep, decode clipped to the context,
    the report). ``removed_before`` / ``limits_before`` / ``rows_before``: filters applied earlier
    (rows the reader dropped before these arrays, rows ``keep`` already excludes)."""
    removed = dict(removed_before or {})
    limits = dict(limits_before or {})
    keep = keep.copy()
    if max_prompt_tokens is not None:
        out = keep & (prompt > max_prompt_tokens)
        removed["max_prompt_tokens"] = int(out.sum())
        limits["max_prompt_tokens"] = max_prompt_tokens
        keep &= ~out
    clipped = 0
    if max_context_tokens is not None:
        out = keep & (prompt >= max_context_tokens)
        removed["max_context_tokens"] = int(out.sum())
        limits["max_context_tokens"] = max_context_tokens
        keep &= ~out
        room = max_context_tokens - prompt
        clipped = int((keep & (decode > room)).sum())
        decode = np.minimum(decode, room)
    report = RowFilterReport(source, rows_before + len(prompt),
                             {r: removed[r] for r in REASONS if r in removed}, limits, clipped)
    return keep, decode, report
