"""UTC offsets in the Azure reader are applied, not guessed by numpy (issue 10, item 7)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from llm_lb_gym.workload import TraceFormatError, read_trace

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _read(tmp_path, stamps):
    path = tmp_path / "tz.csv"
    path.write_text(HEADER + "".join(f"{s},{10 + i},{5 + i}\n" for i, s in enumerate(stamps)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return read_trace(path, "azure")


@pytest.mark.parametrize("later", [
    "2023-11-16 20:00:00.5000000+00:00", "2023-11-16 20:00:00.5000000Z",
    "2023-11-17 01:30:00.5000000+05:30", "2023-11-16T12:00:00.5-0800",
    "2023-11-16 21:00:00.5+01", "2023-11-16 21:00:00.5 +0100"])
def test_offsets_are_converted_to_utc(tmp_path, later):
    """Every spelling of 20:00:00.5 UTC lands 2 h 0.5 s after an offset-free 18:00 (UTC)."""
    data = _read(tmp_path, ["2023-11-16 18:00:00.0000000", later])
    assert data.arrival_s.tolist() == [0.0, 7200.5]


def test_rows_in_different_zones_are_ordered_by_utc(tmp_path):
    """10:00 in New York (-05:00) is after 15:30 in Berlin (+01:00): 15:00 vs 14:30 UTC."""
    data = _read(tmp_path, ["2023-11-16 10:00:00-05:00", "2023-11-16 15:30:00+01:00"])
    assert data.arrival_s.tolist() == [0.0, 1800.0]
    assert data.line.tolist() == [3, 2] and data.prompt_tokens.tolist() == [11, 10]


@pytest.mark.parametrize("bad", ["2023-11-16 18:00:00+24:00", "2023-11-16 18:00:00-05:75"])
def test_out_of_range_offset_is_a_format_error(tmp_path, bad):
    with pytest.raises(TraceFormatError, match=r"line 3, column 'TIMESTAMP'.*offset"):
        _read(tmp_path, ["2023-11-16 18:00:00", bad])


@pytest.mark.parametrize("bad", ["2023-11-16 18:00:00+5", "2023-11-16 18:00:00 EST",
                                 "2023-11-16 18:00:00+05:00:00"])
def test_unparsable_offsets_are_errors_not_numpy_warnings(tmp_path, bad):
    with pytest.raises(TraceFormatError, match=r"line 3, column 'TIMESTAMP'.*not a datetime"):
        _read(tmp_path, ["2023-11-16 18:00:00", bad])


def test_offset_free_file_is_exact(tmp_path):
    """The nanosecond difference, divided once: 3.747927 s exactly as written (epoch seconds in
    float64, as before issue 22, gave 3.747927188873291)."""
    stamps = ["2023-11-16 18:15:46.6805900", "2023-11-16 18:15:50.4285170"]
    data = _read(tmp_path, stamps)
    ns = np.array(stamps).astype("datetime64[ns]").astype(np.int64)
    assert data.arrival_s.tolist() == [0.0, int(ns[1] - ns[0]) / 1e9] == [0.0, 3.747927]
