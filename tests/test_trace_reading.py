"""Trace reading outside the happy path (issue 22, class 2): random bytes, oversized fields and
out-of-range timestamps give ``TraceFormatError`` naming file, line and column, never a raw
``UnicodeDecodeError`` / ``csv.Error`` / ``OverflowError``; every accepted timestamp is exact."""

from __future__ import annotations

import datetime as dt
import json
import os
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_lb_gym.data.timestamps import EXACT_UNITS
from llm_lb_gym.limits import MAX_ARRIVAL_S
from llm_lb_gym.workload import TraceFormatError, read_trace

EXAMPLES = int(os.environ.get("LLM_LB_GYM_HYPOTHESIS_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
BURST_HEADER = b"Timestamp,Model,Request tokens,Response tokens,Log Type\n"
CSV_LIMIT = 131072   # Python's csv.field_size_limit() default


def _valid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _read_bytes(tmp_path, name, data: bytes, fmt: str):
    path = tmp_path / name
    path.write_bytes(data)
    return read_trace(path, fmt)


@SETTINGS
@given(junk=st.binary(max_size=200), where=st.integers(0, 4), row=st.integers(0, 2))
def test_random_bytes_in_any_csv_field_are_read_or_named(tmp_path, junk, where, row):
    """``junk`` (no comma, quote or newline, so the layout holds) replaces field ``where`` of
    data row ``row``: a read column must then parse, an ignored one (Log Type) is ignored."""
    junk = junk.replace(b",", b"").replace(b'"', b"").replace(b"\n", b"").replace(b"\r", b"")
    rows = [[b"1.0", b"gpt-4", b"10", b"20", b"ok"], [b"2.0", b"gpt-4", b"11", b"21", b"ok"],
            [b"3.5", b"ChatGPT", b"12", b"22", b"ok"]]
    rows[row][where] = junk
    data = BURST_HEADER + b"".join(b",".join(r) + b"\n" for r in rows)
    try:
        d = _read_bytes(tmp_path, "b.csv", data, "burstgpt")
    except TraceFormatError as e:
        assert e.path.endswith("b.csv") and e.column and str(e.line) in str(e)
        if not _valid_utf8(junk):
            assert (e.line, e.column) == (row + 2, BURST_HEADER.decode().strip().split(",")[where])
            assert "not valid UTF-8" in str(e)
        return
    assert _valid_utf8(junk)
    if where == 4:   # an ignored column cannot change what is read
        assert d.prompt_tokens.tolist() == [10, 11, 12] or 0 in (10, 11, 12)


@SETTINGS
@given(data=st.binary(max_size=400))
def test_any_bytes_after_a_header_are_read_or_named(tmp_path, data):
    for fmt, header in (("burstgpt", BURST_HEADER), ("mooncake", b"")):
        try:
            _read_bytes(tmp_path, f"x.{fmt}", header + data, fmt)
        except TraceFormatError as e:
            assert e.line >= 1 and e.column


@settings(SETTINGS, max_examples=min(EXAMPLES, 25))
@given(size=st.integers(0, 300) | st.integers(CSV_LIMIT - 3, CSV_LIMIT + 3)
       | st.integers(0, 2 * CSV_LIMIT), where=st.integers(0, 4), quoted=st.booleans())
def test_field_sizes_are_read_or_named(tmp_path, size, where, quoted):
    """A field of ``size`` characters in data row 2 (line 3): up to Python's csv field limit it
    reads (an ignored column) or fails on its value; beyond it the error names line and column."""
    value = b"7" * size
    rows = [[b"1.0", b"gpt-4", b"10", b"20", b"ok"], [b"2.0", b"gpt-4", b"11", b"21", b"ok"]]
    rows[1][where] = b'"' + value + b'"' if quoted else value
    data = BURST_HEADER + b"".join(b",".join(r) + b"\n" for r in rows)
    try:
        d = _read_bytes(tmp_path, "s.csv", data, "burstgpt")
    except TraceFormatError as e:
        if size > CSV_LIMIT:
            assert (e.line, e.column) == (3, BURST_HEADER.decode().strip().split(",")[where])
            assert "field larger than field limit" in str(e)
        else:
            assert where != 4 and e.line == 3
        return
    assert size <= CSV_LIMIT
    if where == 4:
        assert d.prompt_tokens.tolist() == [10, 11]


def test_quote_left_open_is_named_not_swallowing_the_file(tmp_path):
    """Python's lenient csv would read ``"x`` to the end of the file as one field and drop the
    rows after it; strict mode names the record."""
    data = BURST_HEADER + b'1.0,gpt-4,10,20,"ok\n2.0,gpt-4,11,21,ok\n3.0,gpt-4,12,22,ok\n'
    with pytest.raises(TraceFormatError, match=r"line 4, column 'Log Type': not valid CSV.*"
                                               r"record from line 2"):
        _read_bytes(tmp_path, "q.csv", data, "burstgpt")


def test_bad_utf8_in_jsonl_names_line_and_field(tmp_path):
    data = (b'{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
            b'{"timestamp": 5, "input_length": 10, "output_length": 5, "note": "\xff\xfe"}\n')
    with pytest.raises(TraceFormatError, match=r"line 2, column 'note': byte 0xff \(byte 67 of"):
        _read_bytes(tmp_path, "u.jsonl", data, "mooncake")


@pytest.mark.parametrize("line, problem", [
    (b'{"timestamp": 0, "input_length": 1' + b"0" * 5000 + b', "output_length": 5}', "digits"),
    (b'{"timestamp": 0, "input_length": 10, "output_length": 5, "x": ' + b"[" * 100_000
     + b"]" * 100_000 + b"}", "not valid JSON"),
    (b'{"timestamp": ' + b"9" * 400 + b', "input_length": 10, "output_length": 5}', "too large"),
])
def test_json_values_python_cannot_hold_are_named(tmp_path, line, problem):
    data = b'{"timestamp": 0, "input_length": 10, "output_length": 5}\n' + line + b"\n"
    with pytest.raises(TraceFormatError, match=rf"line 2, column .*{problem}"):
        _read_bytes(tmp_path, "big.jsonl", data, "mooncake")


# -- timestamps ---------------------------------------------------------------------------------
@SETTINGS
@given(stamps=st.lists(st.integers(-2 * EXACT_UNITS, 2 * EXACT_UNITS), min_size=1, max_size=6)
       | st.lists(st.integers(-10**15, 10**15), min_size=1, max_size=6))
def test_numeric_timestamps_are_exact_or_named(tmp_path, stamps):
    """Mooncake (ms): arrival = (t - t_min) / 1000, correctly rounded from the exact integers;
    a value float64 cannot hold or a span past MAX_ARRIVAL_S names its line."""
    rows = [json.dumps({"timestamp": t, "input_length": 10, "output_length": 5}) for t in stamps]
    try:
        d = _read_bytes(tmp_path, "t.jsonl", ("\n".join(rows) + "\n").encode(), "mooncake")
    except TraceFormatError as e:
        assert e.column == "timestamp"
        big = [i for i, t in enumerate(stamps) if abs(t) >= EXACT_UNITS]
        if big:
            assert e.line == big[0] + 1 and "2**53" in str(e)
        else:
            lo = min(stamps)
            late = sorted((t, i) for i, t in enumerate(stamps) if (t - lo) / 1000 > MAX_ARRIVAL_S)
            assert late and e.line == late[0][1] + 1 and "MAX_ARRIVAL_S" in str(e)
        return
    lo = min(stamps)
    want = sorted(float(Fraction(t - lo, 1000)) for t in stamps)
    assert d.arrival_s.tolist() == want


@st.composite
def wall_clock(draw):
    """(text, exact nanoseconds since the epoch, UTC): any year 1..9999, 0-9 fractional digits,
    an optional UTC offset."""
    t = draw(st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30))).replace(microsecond=0)
    digits = draw(st.integers(0, 9))
    frac = draw(st.integers(0, 10**digits - 1)) if digits else 0
    off = draw(st.none() | st.integers(-(23 * 60 + 59), 23 * 60 + 59))
    text = t.strftime("%Y-%m-%d %H:%M:%S").rjust(19, "0")
    if t.year < 1000:
        text = f"{t.year:04d}" + text[text.index("-"):]
    if digits:
        text += "." + str(frac).rjust(digits, "0")
    secs = (t - dt.datetime(1970, 1, 1)).days * 86400 + (t - dt.datetime(1970, 1, 1)).seconds
    if off is not None:
        sign, a = ("+" if off >= 0 else "-"), abs(off)
        text += f"{sign}{a // 60:02d}:{a % 60:02d}"
        secs -= off * 60
    return text, secs * 10**9 + frac * 10**(9 - digits)


@SETTINGS
@given(stamps=st.lists(wall_clock(), min_size=1, max_size=5))
def test_datetimes_are_exact_or_named(tmp_path, stamps):
    """Azure: any year numpy parses (far past datetime64[ns]'s 1678-2262, which wraps silently),
    arrivals = exact nanosecond differences / 1e9; a span past MAX_ARRIVAL_S names its line."""
    body = "".join(f"{text},{10 + i},{5 + i}\n" for i, (text, _) in enumerate(stamps))
    try:
        d = _read_bytes(tmp_path, "a.csv", ("TIMESTAMP,ContextTokens,GeneratedTokens\n" + body).encode(),
                        "azure")
    except TraceFormatError as e:
        lo = min(ns for _, ns in stamps)
        late = sorted((ns, i) for i, (_, ns) in enumerate(stamps) if ns - lo > MAX_ARRIVAL_S * 10**9)
        assert late, str(e)
        assert (e.line, e.column) == (late[0][1] + 2, "TIMESTAMP") and "MAX_ARRIVAL_S" in str(e)
        return
    lo = min(ns for _, ns in stamps)
    assert d.arrival_s.tolist() == sorted((ns - lo) / 10**9 for _, ns in stamps)


def test_far_dates_are_not_wrapped(tmp_path):
    """numpy parses 9999-12-31 as datetime64[ns] to 1816-03-30 without a word."""
    body = "9999-12-31 23:59:59.5,10,5\n9999-12-31 23:59:58,11,6\n"
    path = tmp_path / "far.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + body)
    assert read_trace(path, "azure").arrival_s.tolist() == [0.0, 1.5]


def test_tenth_fractional_digit_is_named(tmp_path):
    path = tmp_path / "ps.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00,10,5\n"
                    "2023-01-01 00:00:00.1234567891,10,5\n")
    with pytest.raises(TraceFormatError, match=r"line 3, column 'TIMESTAMP'.*10 fractional digits"):
        read_trace(path, "azure")


def test_numeric_timestamp_beyond_float64_is_named(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens\n1,m,10,5\n"
                    f"{2**53 + 1},m,10,5\n")
    with pytest.raises(TraceFormatError, match=r"line 3, column 'Timestamp'.*2\*\*53"):
        read_trace(path, "burstgpt")
