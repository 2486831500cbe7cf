"""Reading request traces: parse a file once into columns, reject anything malformed.

One reader serves every layout in ``formats.TRACE_FORMATS`` (azure, lengths, mooncake,
burstgpt): the format's entry names the container, the columns, the time unit, the task column
and the zero-token rule. Other columns or fields are ignored. Wall-clock timestamps (``azure``;
the published trace has 7 fractional digits, parsed by numpy as ns) may end in a UTC offset
(``Z``, ``+00:00``, ``+05:30``, ``-0800``, ``+01``), which is applied, so rows written in
different zones order correctly; a datetime without one is taken as UTC (the published trace
has none); an offset of 24 h or more is an error.

Every value is checked: a missing column, an unparsable or non-integral number, a negative
count, a count above ``limits.MAX_TOKENS`` (2**31 - 1) or an unparsable timestamp raises
``TraceFormatError`` naming the file, the line and the column. Zero token counts are a policy
(``zero_tokens``): the format's default (``drop`` for BurstGPT, whose failed requests have 0
response tokens; ``error`` for the others), or ``zero_tokens="drop"`` / ``"error"``; dropped
rows are counted in ``TraceData.dropped_zero_rows``. Rows are sorted by timestamp (stable) if
the file is not; arrivals are seconds from the earliest row, at most ``limits.MAX_ARRIVAL_S``
(1e9 s, about 31.7 years; a later row is an error).
"""

from __future__ import annotations

import csv
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._validate import check_choice
from ..limits import MAX_ARRIVAL_S, MAX_TOKENS
from .formats import TIME_UNITS, TRACE_FORMATS, ZERO_TOKEN_POLICIES, TraceFormat


class TraceFormatError(ValueError):
    """A trace file is malformed; the message names the file, the line and the column."""

    def __init__(self, path, line: int, column: str, problem: str) -> None:
        super().__init__(f"{path}, line {line}, column {column!r}: {problem}")
        self.path, self.line, self.column = str(path), line, column


@dataclass(frozen=True, eq=False)
class TraceData:
    """A parsed trace: one entry per request, sorted by arrival when it has timestamps."""

    path: str
    format: str
    arrival_s: np.ndarray | None
    """float64 seconds from the earliest request, non-decreasing; None for length-only files."""
    prompt_tokens: np.ndarray
    decode_tokens: np.ndarray
    task_id: np.ndarray
    task_names: tuple[str, ...]
    line: np.ndarray
    """Source line of each request (1 = header), for provenance and error messages."""
    dropped_zero_rows: int = 0
    """Rows removed because a token count was 0 under ``zero_tokens="drop"``."""
    prefix_hashes: tuple | None = None
    """Per request the prompt's chained block hash ids (a tuple, or None for a row without
    them), when the format has a hash column; None otherwise."""
    hash_block_tokens: int = 0
    """Tokens per hash block (the format's)."""

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def has_timestamps(self) -> bool:
        return self.arrival_s is not None

    @property
    def mean_rate_rps(self) -> float | None:
        """Requests per second over the trace's span (None without timestamps)."""
        if self.arrival_s is None or len(self) < 2 or self.arrival_s[-1] == 0:
            return None
        return (len(self) - 1) / float(self.arrival_s[-1])


# -- value parsing ------------------------------------------------------------------------------
def _parse_floats(path, column: str, values, lines: np.ndarray) -> np.ndarray:
    """float64 array of ``values`` (strings or numbers); the first bad one raises with its line."""
    try:
        out = np.asarray(values, dtype=np.float64) if not isinstance(values, np.ndarray) \
            else values.astype(np.float64)
    except (ValueError, TypeError):
        out = None
    if out is None or not np.all(np.isfinite(out)):
        for value, line in zip(values, lines):
            if isinstance(value, bool):
                raise TraceFormatError(path, int(line), column, f"{value!r} is not a number")
            try:
                number = float(value)
            except (ValueError, TypeError):
                shown = "empty value" if str(value).strip() == "" else f"{value!r} is not a number"
                raise TraceFormatError(path, int(line), column, shown) from None
            if not np.isfinite(number):
                raise TraceFormatError(path, int(line), column, f"{value!r} is not finite")
    return out


def _parse_tokens(path, column: str, values, lines: np.ndarray) -> np.ndarray:
    """int64 token counts in [0, MAX_TOKENS]; fractions, negatives and huge counts raise with
    their line."""
    numbers = _parse_floats(path, column, values, lines)
    bad = np.flatnonzero((numbers != np.floor(numbers)) | (numbers < 0) | (numbers > MAX_TOKENS))
    if len(bad):
        i = int(bad[0])
        if numbers[i] < 0:
            problem = "is negative"
        elif numbers[i] > MAX_TOKENS:
            problem = f"exceeds the limit MAX_TOKENS={MAX_TOKENS} (llm_lb_gym.limits)"
        else:
            problem = "is not a whole number of tokens"
        raise TraceFormatError(path, int(lines[i]), column, f"{values[i]!r} {problem}")
    return numbers.astype(np.int64)


def _parse_datetimes(path, column: str, values, lines: np.ndarray) -> np.ndarray:
    """Seconds (float64) since the epoch, UTC, from ISO-like datetime strings; a trailing UTC
    offset (``Z``, ``+05:30``, ``-0800``, ``+01``) is applied, none means UTC."""
    cleaned, offsets = [], np.zeros(len(values), dtype=np.int64)
    for i, value in enumerate(values):
        text, offset_s = _split_offset(value)
        if offset_s is None:
            raise TraceFormatError(path, int(lines[i]), column,
                                   f"{value!r} has a UTC offset outside -23:59..+23:59")
        cleaned.append(text)
        offsets[i] = offset_s
    cleaned = np.array(cleaned)
    with warnings.catch_warnings():
        # numpy warns and guesses on an offset it is left to parse: make that a parse error.
        warnings.simplefilter("error", UserWarning)
        try:
            stamps = cleaned.astype("datetime64[ns]")
        except (ValueError, UserWarning):
            stamps = None
        if stamps is None or np.any(np.isnat(stamps)):
            for value, text, line in zip(values, cleaned, lines):
                try:
                    if np.isnat(np.datetime64(text, "ns")):
                        raise ValueError
                except (ValueError, UserWarning):
                    raise TraceFormatError(
                        path, int(line), column,
                        f"{value!r} is not a datetime (YYYY-MM-DD HH:MM:SS.fff, optional UTC "
                        "offset such as Z or +05:30)") from None
            raise TraceFormatError(path, int(lines[0]), column, "timestamps do not parse as one array")
    ns = stamps.astype(np.int64)
    if offsets.any():
        ns = ns - offsets * 1_000_000_000   # local time minus its offset is UTC
    return ns.astype(np.float64) * 1e-9


def _check_span(path, column: str, arrival: np.ndarray, values, lines: np.ndarray,
                order: np.ndarray) -> None:
    """Reject the first row (in time order) past ``limits.MAX_ARRIVAL_S`` after the earliest."""
    late = np.flatnonzero(~(arrival <= MAX_ARRIVAL_S))
    if len(late):
        first, row = int(order[0]), int(order[late[0]])
        raise TraceFormatError(
            path, int(lines[row]), column,
            f"{values[row]!r} is {arrival[late[0]]:.6g} s after the earliest row (line "
            f"{int(lines[first])}); arrivals are limited to MAX_ARRIVAL_S={MAX_ARRIVAL_S:g} s "
            "(llm_lb_gym.limits)")


_OFFSET = re.compile(r"(.*\d[T ]?\d{1,2}:\d{2}(?::\d{2}(?:\.\d*)?)?)\s*"
                     r"(?:([Zz])|([+-])(\d{2})(?::?(\d{2}))?)")


def _split_offset(text: str) -> tuple[str, int | None]:
    """(naive datetime text, UTC offset in seconds); offset None when out of range."""
    text = text.strip()
    m = _OFFSET.fullmatch(text)
    if m is None:
        return text, 0
    naive, zulu, sign, hours, minutes = m.groups()
    if zulu:
        return naive, 0
    h, mins = int(hours), int(minutes or 0)
    if h > 23 or mins > 59:
        return naive, None
    return naive, (h * 3600 + mins * 60) * (1 if sign == "+" else -1)


# -- file readers -------------------------------------------------------------------------------
def _read_csv(path: Path, columns: dict[str, str]) -> tuple[dict[str, list[str]], np.ndarray]:
    """The named columns as lists of strings, plus each row's line number."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(path, 1, next(iter(columns.values())), "file is empty (no header)")
        names = [h.strip() for h in header]
        index = {}
        for name in columns.values():
            if name not in names:
                raise TraceFormatError(path, 1, name,
                                       f"missing column; header has: {', '.join(names)}")
            index[name] = names.index(name)
        need = max(index.values()) + 1
        out: dict[str, list[str]] = {name: [] for name in index}
        lines: list[int] = []
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) < need:
                missing = next(n for n, i in index.items() if i >= len(row))
                raise TraceFormatError(path, reader.line_num, missing,
                                       f"row has {len(row)} fields, header has {len(names)}")
            for name, i in index.items():
                out[name].append(row[i])
            lines.append(reader.line_num)
    return out, np.asarray(lines, dtype=np.int64)


def _read_jsonl(path: Path, fields: dict[str, str], text_fields: frozenset = frozenset(),
                hash_field: str | None = None) -> tuple[dict[str, list], np.ndarray]:
    """The named fields of every JSON object (numbers, or strings for ``text_fields``), plus
    each object's line number; ``hash_field`` (optional per row): a list of integer ids."""
    out: dict[str, list] = {name: [] for name in fields.values()}
    hashes: list = []
    lines: list[int] = []
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                raise TraceFormatError(path, number, "(whole line)", f"not valid JSON: {e.msg}") from None
            if not isinstance(record, dict):
                raise TraceFormatError(path, number, "(whole line)", "not a JSON object")
            for name in fields.values():
                if name not in record:
                    raise TraceFormatError(path, number, name, "missing field")
                value = record[name]
                if name in text_fields:
                    if not isinstance(value, str):
                        raise TraceFormatError(path, number, name, f"{value!r} is not a string")
                elif isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TraceFormatError(path, number, name, f"{value!r} is not a number")
                out[name].append(value)
            if hash_field is not None:
                ids = record.get(hash_field)
                if ids is not None and not (isinstance(ids, list) and all(
                        isinstance(x, int) and not isinstance(x, bool) for x in ids)):
                    raise TraceFormatError(path, number, hash_field,
                                           f"{str(ids)[:40]!r} is not a list of integer ids")
                if ids is not None and len(set(ids)) != len(ids):
                    raise TraceFormatError(path, number, hash_field, _repeat_problem(ids))
                hashes.append(None if ids is None else tuple(ids))
            lines.append(number)
    if hash_field is not None:
        out[hash_field] = hashes
    return out, np.asarray(lines, dtype=np.int64)


def _repeat_problem(ids: list) -> str:
    """A chain id names the whole prefix up to its block, so a repeat is corrupt data (and would
    let one request's blocks share one cached copy: an over-subscribed KV cache)."""
    seen: set = set()
    for i, h in enumerate(ids):
        if h in seen:
            return (f"hash id {h} repeats at position {i} (first at {ids.index(h)}); the ids of "
                    "one prompt's chain must be distinct")
        seen.add(h)
    return "hash ids repeat"


def _parse_times(path, fmt: TraceFormat, values, lines: np.ndarray) -> np.ndarray:
    """Seconds (float64, absolute; the caller subtracts the earliest) in the format's unit."""
    if fmt.time_unit == "datetime":
        return _parse_datetimes(path, fmt.time_column, values, lines)
    return _parse_floats(path, fmt.time_column, values, lines) * TIME_UNITS[fmt.time_unit]


def _parse_tasks(path, fmt: TraceFormat, values, lines: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
    """Sorted distinct task names and each row's index into them; an empty name is an error."""
    names = np.asarray([str(v).strip() for v in values])
    empty = np.flatnonzero(names == "")
    if len(empty):
        raise TraceFormatError(path, int(lines[empty[0]]), fmt.task_column, "empty value")
    task_names, task_id = np.unique(names, return_inverse=True)
    return tuple(str(t) for t in task_names), task_id.astype(np.int64)


def read_trace(path: str | Path, format: str, zero_tokens: str | None = None) -> TraceData:
    """Parse ``path`` in ``format`` (a key of ``TRACE_FORMATS``; see the module docstring);
    raises ``TraceFormatError`` (file, line, column) on anything malformed."""
    check_choice("format", format, TRACE_FORMATS)
    fmt = TRACE_FORMATS[format]
    zero_tokens = fmt.zero_tokens if zero_tokens is None else zero_tokens
    check_choice("zero_tokens", zero_tokens, ZERO_TOKEN_POLICIES)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    names = fmt.columns
    if fmt.container == "jsonl":
        text = frozenset({fmt.task_column} - {None})
        raw, lines = _read_jsonl(path, names, text, fmt.hash_column)
    else:
        raw, lines = _read_csv(path, names)
    if len(lines) == 0:
        raise TraceFormatError(path, 2, fmt.prompt_column, "no data rows")

    prompt = _parse_tokens(path, fmt.prompt_column, raw[fmt.prompt_column], lines)
    decode = _parse_tokens(path, fmt.decode_column, raw[fmt.decode_column], lines)
    zero = (prompt == 0) | (decode == 0)
    if zero.any() and zero_tokens == "error":
        i = int(np.flatnonzero(zero)[0])
        column = fmt.prompt_column if prompt[i] == 0 else fmt.decode_column
        raise TraceFormatError(path, int(lines[i]), column,
                               "0 tokens; pass zero_tokens='drop' to skip such rows")
    arrival = None if not fmt.has_timestamps else _parse_times(path, fmt, raw[fmt.time_column], lines)
    if fmt.task_column is not None:
        task_names, task_id = _parse_tasks(path, fmt, raw[fmt.task_column], lines)
    else:
        task_names, task_id = (path.stem,), np.zeros(len(lines), dtype=np.int64)

    order = np.flatnonzero(~zero)
    if arrival is not None:
        order = order[np.argsort(arrival[order], kind="stable")]
    if len(order) == 0:
        raise TraceFormatError(path, int(lines[0]), fmt.decode_column,
                               "every row has 0 tokens; nothing left after dropping them")
    if arrival is not None:
        arrival = arrival[order] - arrival[order[0]]
        _check_span(path, fmt.time_column, arrival, raw[fmt.time_column], lines, order)
        arrival.setflags(write=False)
    columns = [prompt[order], decode[order], task_id[order], lines[order]]
    for c in columns:
        c.setflags(write=False)
    hashes = None
    if fmt.hash_column is not None and fmt.container == "jsonl":
        hashes = tuple(raw[fmt.hash_column][i] for i in order)
    return TraceData(str(path), format, arrival, *columns[:3], task_names, columns[3],
                     dropped_zero_rows=int(zero.sum()), prefix_hashes=hashes,
                     hash_block_tokens=fmt.hash_block_tokens or 0)
