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
(1e9 s, about 31.7 years; a later row is an error), computed exactly (``timestamps.py``: a
timestamp float64 cannot hold, or a tenth fractional digit, is an error, never a rounding).

Files must be UTF-8 (a leading byte-order mark is dropped); a byte that is not raises naming its
line and the column it falls in, as does anything Python's ``csv`` module rejects (a field over
its ``csv.field_size_limit``, 131,072 characters by default, even in a column the reader
ignores; a quote left open, which its lenient mode would let swallow the rest of the file).
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._validate import check_choice
from ..limits import MAX_TOKENS
from .formats import TRACE_FORMATS, ZERO_TOKEN_POLICIES, TraceFormat, TraceFormatError
from .timestamps import arrivals, parse_datetimes, parse_numbers

__all__ = ["TraceData", "TraceFormatError", "read_trace"]


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
    except (ValueError, TypeError, OverflowError):   # OverflowError: a JSON int past float64
        out = None
    if out is None or not np.all(np.isfinite(out)):
        for value, line in zip(values, lines):
            if isinstance(value, bool):
                raise TraceFormatError(path, int(line), column, f"{value!r} is not a number")
            try:
                number = float(value)
            except OverflowError:
                raise TraceFormatError(path, int(line), column, f"{str(value)[:40]!r}... is too large "
                                       "for a float64") from None
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


# -- file readers -------------------------------------------------------------------------------
_SURROGATE = re.compile("[\udc80-\udcff]")   # an undecodable byte under surrogateescape


def _read_text(path: Path, container: str) -> str:
    """The whole file as text: UTF-8, a leading byte-order mark dropped. A byte that is not
    UTF-8 raises naming its line, the column (field) it falls in and its offset in the line."""
    data = path.read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        start = e.start
    line = data.count(b"\n", 0, start) + 1
    offset = start - (data.rfind(b"\n", 0, start) + 1) + 1
    column = _column_of_bad_byte(data.decode("utf-8", "surrogateescape"), line, container)
    raise TraceFormatError(path, line, column, f"byte 0x{data[start]:02x} (byte {offset} of the "
                           "line) is not valid UTF-8; trace files must be UTF-8 text")


def _column_of_bad_byte(text: str, line: int, container: str) -> str:
    """The CSV column or JSON field whose value holds the first undecodable byte (the error path
    only); "(whole line)" when it cannot be told."""
    try:
        if container == "csv":
            reader = csv.reader(io.StringIO(text, newline=""), strict=True)
            header = next(reader)
            for row in [header] if _SURROGATE.search(",".join(header)) else reader:
                for i, field in enumerate(row):
                    if _SURROGATE.search(field):
                        return "(header)" if row is header else (
                            header[i].strip() if i < len(header) else f"field {i + 1}")
        else:
            record = json.loads(io.StringIO(text, newline=None).readlines()[line - 1])
            for key, value in record.items():
                if _SURROGATE.search(key) or _SURROGATE.search(str(value)):
                    return key
    except (csv.Error, ValueError, RecursionError, AttributeError, IndexError, StopIteration):
        pass
    return "(whole line)"


def _open_field(record: str) -> int:
    """Index of the field a CSV parser stopped in within ``record``: the first longer than
    ``csv.field_size_limit()`` (the parser reads the whole line before it raises), else the one
    open at the end (commas outside quotes)."""
    limit = csv.field_size_limit()
    quoted, field, size = False, 0, 0
    for ch in record:
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            field, size = field + 1, 0
        else:
            size += 1
            if size > limit:
                return field
    return field


def _csv_error(path: Path, text: str, first: int, last: int, names: list[str],
               e: csv.Error) -> TraceFormatError:
    """``csv.Error`` (a field over Python's ``csv.field_size_limit``, a quote left open at the end
    of the file, text after a closing quote) as a TraceFormatError at the record's field."""
    lines = io.StringIO(text, newline="").readlines()
    i = _open_field("".join(lines[first - 1:last]))
    column = names[i] if i < len(names) else f"field {i + 1}"
    return TraceFormatError(path, last, column, f"not valid CSV: {e} (record from line {first})")


def _read_csv(path: Path, columns: dict[str, str]) -> tuple[dict[str, list[str]], np.ndarray]:
    """The named columns as lists of strings, plus each row's line number. Strict CSV: a quote
    left open swallows the rest of the file into one field in Python's lenient mode."""
    text = _read_text(path, "csv")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
    except csv.Error as e:
        raise _csv_error(path, text, 1, reader.line_num, [], e) from None
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
    done = reader.line_num
    try:
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                done = reader.line_num
                continue
            if len(row) < need:
                missing = next(n for n, i in index.items() if i >= len(row))
                raise TraceFormatError(path, reader.line_num, missing,
                                       f"row has {len(row)} fields, header has {len(names)}")
            for name, i in index.items():
                out[name].append(row[i])
            lines.append(reader.line_num)
            done = reader.line_num
    except csv.Error as e:
        raise _csv_error(path, text, done + 1, max(reader.line_num, done + 1), names, e) from None
    return out, np.asarray(lines, dtype=np.int64)


def _read_jsonl(path: Path, fields: dict[str, str], text_fields: frozenset = frozenset(),
                hash_field: str | None = None) -> tuple[dict[str, list], np.ndarray]:
    """The named fields of every JSON object (numbers, or strings for ``text_fields``), plus
    each object's line number; ``hash_field`` (optional per row): a list of integer ids."""
    out: dict[str, list] = {name: [] for name in fields.values()}
    hashes: list = []
    lines: list[int] = []
    for number, text in enumerate(io.StringIO(_read_text(path, "jsonl"), newline=None), start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceFormatError(path, number, "(whole line)", f"not valid JSON: {e.msg}") from None
        except (ValueError, RecursionError) as e:   # an integer of > 4300 digits; deep nesting
            raise TraceFormatError(path, number, "(whole line)",
                                   f"not valid JSON: {str(e)[:120] or type(e).__name__}") from None
        if not isinstance(record, dict):
            raise TraceFormatError(path, number, "(whole line)", "not a JSON object")
        for name in fields.values():
            if name not in record:
                raise TraceFormatError(path, number, name, "missing field")
            value = record[name]
            if name in text_fields:
                if not isinstance(value, str):
                    raise TraceFormatError(path, number, name, f"{str(value)[:40]!r} is not a string")
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TraceFormatError(path, number, name, f"{str(value)[:40]!r} is not a number")
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


def _time_keys(path, fmt: TraceFormat, values, lines: np.ndarray):
    """What ``timestamps.arrivals`` orders and subtracts: numbers in the format's unit, or
    (whole seconds, nanoseconds) of datetimes."""
    if fmt.time_unit == "datetime":
        return parse_datetimes(path, fmt.time_column, values, lines)
    numbers = _parse_floats(path, fmt.time_column, values, lines)
    return parse_numbers(path, fmt.time_column, numbers, values, lines)


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
    keys = None if not fmt.has_timestamps else _time_keys(path, fmt, raw[fmt.time_column], lines)
    if fmt.task_column is not None:
        task_names, task_id = _parse_tasks(path, fmt, raw[fmt.task_column], lines)
    else:
        task_names, task_id = (path.stem,), np.zeros(len(lines), dtype=np.int64)

    order = np.flatnonzero(~zero)
    if len(order) == 0:
        raise TraceFormatError(path, int(lines[0]), fmt.decode_column,
                               "every row has 0 tokens; nothing left after dropping them")
    arrival = None
    if keys is not None:
        order, arrival = arrivals(path, fmt, keys, raw[fmt.time_column], lines, order)
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
