"""Trace formats: one table entry per layout, read by the one reader in ``traces.py``.

A format says which file container it is (CSV with a header, or JSON lines), which column holds
each request's prompt and output token counts, which holds its arrival time and in what unit,
which (if any) names its task, and what a row with 0 tokens means. Adding a format is adding an
entry here; ``read_trace`` has no per-format branches.
"""

from __future__ import annotations

from dataclasses import dataclass

CONTAINERS = ("csv", "jsonl")
TIME_UNITS = {"s": 1, "ms": 1_000, "us": 1_000_000, "datetime": None}
"""Arrival-time units: units per second for numbers (the reader divides by it: one correctly
rounded operation); ``datetime`` is wall-clock text (ISO-like, optional UTC offset such as ``Z``
or ``+05:30``; none means UTC)."""
ZERO_TOKEN_POLICIES = ("error", "drop")


class TraceFormatError(ValueError):
    """A trace file is malformed; the message names the file, the line and the column."""

    def __init__(self, path, line: int, column: str, problem: str) -> None:
        super().__init__(f"{path}, line {line}, column {column!r}: {problem}")
        self.path, self.line, self.column = str(path), line, column


@dataclass(frozen=True)
class TraceFormat:
    """How one trace layout maps onto requests."""

    name: str
    """The ``format=`` value."""
    container: str
    """"csv" (header row, comma-separated) or "jsonl" (one JSON object per line)."""
    prompt_column: str
    """Prompt (input, context) tokens per request."""
    decode_column: str
    """Output (generated, response) tokens per request."""
    time_column: str | None
    """Arrival time per request; None for length-only files (arrivals must be synthetic)."""
    time_unit: str | None
    """Unit of ``time_column``: a key of ``TIME_UNITS`` (None iff there is no time column)."""
    task_column: str | None
    """Names each request's task (e.g. the model called); None: one task per file."""
    zero_tokens: str
    """Default for rows with 0 prompt or output tokens: "error" or "drop" (counted)."""
    origin: str
    """Where the layout comes from (shown by ``python -m llm_lb_gym.data list``)."""
    hash_column: str | None = None
    """Optional list of each prompt's chained block hash ids (prefix caching); None: none."""
    hash_block_tokens: int | None = None
    """Tokens per hash block of ``hash_column`` (given iff it is)."""

    def __post_init__(self) -> None:
        if self.container not in CONTAINERS:
            raise ValueError(f"TraceFormat {self.name}: container={self.container!r}; "
                             f"allowed: {', '.join(CONTAINERS)}")
        if (self.time_column is None) != (self.time_unit is None):
            raise ValueError(f"TraceFormat {self.name}: time_column and time_unit go together")
        if self.time_unit is not None and self.time_unit not in TIME_UNITS:
            raise ValueError(f"TraceFormat {self.name}: time_unit={self.time_unit!r}; "
                             f"allowed: {', '.join(TIME_UNITS)}")
        if (self.hash_column is None) != (self.hash_block_tokens is None):
            raise ValueError(f"TraceFormat {self.name}: hash_column and hash_block_tokens go together")
        if self.zero_tokens not in ZERO_TOKEN_POLICIES:
            raise ValueError(f"TraceFormat {self.name}: zero_tokens={self.zero_tokens!r}; "
                             f"allowed: {', '.join(ZERO_TOKEN_POLICIES)}")

    @property
    def has_timestamps(self) -> bool:
        return self.time_column is not None

    @property
    def columns(self) -> dict[str, str]:
        """Role ("time", "task", "prompt", "decode") -> column name, for the columns it reads."""
        roles = {"time": self.time_column, "task": self.task_column,
                 "prompt": self.prompt_column, "decode": self.decode_column}
        return {role: name for role, name in roles.items() if name is not None}


TRACE_FORMATS: dict[str, TraceFormat] = {f.name: f for f in (
    TraceFormat("azure", "csv", "ContextTokens", "GeneratedTokens", "TIMESTAMP", "datetime", None,
                # The 2023 conversation trace has no zero (GeneratedTokens >= 7 in all 19,366 rows).
                "error", "Azure LLM inference traces 2023/2024 (Azure/AzurePublicDataset)"),
    TraceFormat("lengths", "csv", "num_prefill_tokens", "num_decode_tokens", None, None, None,
                "error", "length-only exports of microsoft/vidur and microsoft/sarathi-serve"),
    # hash_ids: one id per 512-token block of the prompt, the last block possibly partial.
    TraceFormat("mooncake", "jsonl", "input_length", "output_length", "timestamp", "ms", None,
                "error", "Mooncake traces (kvcache-ai/Mooncake, FAST'25 release)",
                hash_column="hash_ids", hash_block_tokens=512),
    # BurstGPT logs failed requests as rows with 0 response tokens: dropped (and counted).
    TraceFormat("burstgpt", "csv", "Request tokens", "Response tokens", "Timestamp", "s", "Model",
                "drop", "BurstGPT (HPMLL/BurstGPT); the Model column becomes the task"),
)}
"""Every trace layout by name (the ``format=`` option of trace workloads)."""
