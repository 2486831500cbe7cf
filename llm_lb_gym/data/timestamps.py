"""Trace timestamps to arrival times, exactly: every accepted timestamp becomes the arrival the
file says, or the row is rejected naming file, line and column.

Arrivals are differences from the earliest row, so they are computed as differences first and
converted once, never as absolute seconds since the epoch in float64 (which holds 2023 only to
about 0.2 us) nor in a fixed-width type that a far date overflows:

- numbers (``s``, ``ms``, ``us``): float64 values below 2**53 units in magnitude (beyond that
  float64 skips whole units, so two distinct timestamps could read as one); arrival = (t - t_min) / units per
  second, one correctly rounded division;
- datetimes: whole seconds (numpy's ``datetime64[s]``, any year it parses, far beyond
  ``datetime64[ns]``'s 1678-2262, which numpy wraps around silently) plus up to 9 fractional
  digits as integer nanoseconds (a tenth digit is an error, not a truncation), with the UTC
  offset applied to the seconds; arrival = integer nanoseconds from the earliest / 1e9, correctly
  rounded.

Every row later than ``limits.MAX_ARRIVAL_S`` after the earliest is an error naming that row.
"""

from __future__ import annotations

import re
import warnings

import numpy as np

from ..limits import MAX_ARRIVAL_S
from .formats import TIME_UNITS, TraceFormat, TraceFormatError

EXACT_UNITS = 2 ** 53
"""Numeric timestamps (in their unit) must be smaller in magnitude: float64 holds every whole
number below it, and text such as 2**53 + 1 already reads as 2**53."""
_NS = 1_000_000_000
_OFFSET = re.compile(r"(.*\d[T ]?\d{1,2}:\d{2}(?::\d{2}(?:\.\d*)?)?)\s*"
                     r"(?:([Zz])|([+-])(\d{2})(?::?(\d{2}))?)")
_FRACTION = re.compile(r"(.*\d:\d{2}:\d{2})\.(\d*)")


def split_offset(text: str) -> tuple[str, int | None]:
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


def _bad_datetime(path, line, column, value) -> TraceFormatError:
    return TraceFormatError(path, int(line), column,
                            f"{value!r} is not a datetime (YYYY-MM-DD HH:MM:SS.fff, optional UTC "
                            "offset such as Z or +05:30)")


def parse_datetimes(path, column: str, values, lines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(whole seconds since the epoch, UTC, int64; nanoseconds past them, int64 in [0, 1e9))."""
    n = len(values)
    bases, frac = [], np.zeros(n, np.int64)
    offsets = np.zeros(n, np.int64)
    for i, value in enumerate(values):
        text, offset_s = split_offset(str(value))
        if offset_s is None:
            raise TraceFormatError(path, int(lines[i]), column,
                                   f"{value!r} has a UTC offset outside -23:59..+23:59")
        m = _FRACTION.fullmatch(text)
        if m is not None:
            text, digits = m.groups()
            if len(digits) > 9:
                raise TraceFormatError(path, int(lines[i]), column,
                                       f"{value!r} has {len(digits)} fractional digits; at most 9 "
                                       "(nanoseconds) are kept exactly")
            frac[i] = int(digits.ljust(9, "0")) if digits else 0
        bases.append(text)
        offsets[i] = offset_s
    with warnings.catch_warnings():
        # numpy warns and guesses on an offset it is left to parse: make that a parse error.
        warnings.simplefilter("error", UserWarning)
        try:
            whole = np.array(bases).astype("datetime64[s]")
        except (ValueError, UserWarning, OverflowError):
            whole = None
        if whole is None or np.any(np.isnat(whole)):
            for value, text, line in zip(values, bases, lines):
                try:
                    if np.isnat(np.datetime64(text, "s")):
                        raise ValueError
                except (ValueError, UserWarning, OverflowError):
                    raise _bad_datetime(path, line, column, value) from None
            raise TraceFormatError(path, int(lines[0]), column, "timestamps do not parse as one array")
    return whole.astype(np.int64) - offsets, frac   # local time minus its offset is UTC


def parse_numbers(path, column: str, numbers: np.ndarray, values, lines: np.ndarray) -> np.ndarray:
    """``numbers`` (float64, finite) checked against ``EXACT_UNITS``."""
    big = np.flatnonzero(~(np.abs(numbers) < EXACT_UNITS))   # 2**53 + 1 reads as 2**53
    if len(big):
        i = int(big[0])
        raise TraceFormatError(path, int(lines[i]), column,
                               f"{values[i]!r} is outside +-2**53, where float64 holds every whole "
                               "number; timestamps this large would lose digits")
    return numbers


def _too_late(path, column, values, lines, row, first, span_s) -> TraceFormatError:
    return TraceFormatError(
        path, int(lines[row]), column,
        f"{values[row]!r} is {span_s:.6g} s after the earliest row (line {int(lines[first])}); "
        f"arrivals are limited to MAX_ARRIVAL_S={MAX_ARRIVAL_S:g} s (llm_lb_gym.limits)")


def arrivals(path, fmt: TraceFormat, keys, values, lines: np.ndarray,
             rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``rows`` in time order, stable; their arrival seconds from the earliest, exact). ``keys``:
    ``parse_numbers``' array, or ``parse_datetimes``' pair."""
    column = fmt.time_column
    if isinstance(keys, tuple):
        whole, frac = keys
        order = rows[np.lexsort((frac[rows], whole[rows]))]   # stable: ties keep file order
        w0, f0 = whole[order[0]], frac[order[0]]
        coarse = whole[order].astype(np.float64) - float(w0)   # no int64 overflow on any span
        late = np.flatnonzero(~(coarse <= MAX_ARRIVAL_S + 1))
        if len(late):
            raise _too_late(path, column, values, lines, int(order[late[0]]), int(order[0]),
                            coarse[late[0]])
        ns = (whole[order] - w0) * _NS + (frac[order] - f0)
        out = np.array([d / _NS for d in ns.tolist()], np.float64)   # int / int: correctly rounded
    else:
        order = rows[np.argsort(keys[rows], kind="stable")]
        out = (keys[order] - keys[order[0]]) / TIME_UNITS[fmt.time_unit]
    late = np.flatnonzero(~(out <= MAX_ARRIVAL_S))
    if len(late):
        raise _too_late(path, column, values, lines, int(order[late[0]]), int(order[0]),
                        out[late[0]])
    return order, out
