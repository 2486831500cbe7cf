"""The llama.cpp profile's file: where this machine's profile lies, its columns, reading and writing.

Shared by ``calibrate_llamacpp`` (which measures and fits it) and ``sim_to_real`` (which reads its
probe reference to put a replay's waits on the same quiet-core footing); entry points do not
import each other (``tests/test_entry_points.py``).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from llm_lb_gym.calibration.vidur_profiles import CalibrationPoint

PROFILE_CSV = Path(__file__).with_name("profiles") / "llamacpp_smollm2_135m_q4_1_1thread.csv"
"""The committed profile of this machine (one AVX2 core, llama-cpp-python 0.3.36's llama.cpp)."""
FIELDS = ("phase", "label", "prefill_tokens", "prefill_attn_pairs", "decode_seqs", "decode_ctx_tokens",
          "wall_s", "run_share", "repeats", "probe_s")
"""``wall_s``: the measured step time; ``run_share``: the share of the measurement during which
the server's thread was on a CPU (``/proc/PID/schedstat``; the rest it waited for one, the
machine being shared); ``probe_s``: the CPU probe's time around the point (``_contention.py``).
The fit uses ``wall_s x run_share x min(probe_s) / probe_s``: the step on a quiet core of its own.
Phase ``frontend`` rows hold a lone request's streamed TTFT beyond the server's prompt time."""


@dataclass(frozen=True)
class Measured:
    """A profiled point: its net time (``point.gpu_s``: wall time x the share of it the server's
    thread was on a CPU, i.e. the time on a core of its own), and the raw reading."""

    point: CalibrationPoint
    wall_s: float
    run_share: float
    probe_s: float = float("nan")


def write_points(points: Sequence[Measured], path: Path, repeats: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for m in points:
            p = m.point
            w.writerow([p.phase, p.label, p.prefill_tokens, p.prefill_attn_pairs, p.decode_seqs,
                        p.decode_ctx_tokens, f"{m.wall_s:.9f}", f"{m.run_share:.4f}", repeats, f"{m.probe_s:.9f}"])


def read_rows(path: Path | str = PROFILE_CSV) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    needed = set(FIELDS) - {"probe_s"}   # profiles before issue 33 have no probe column
    if not rows or needed - set(rows[0]):
        raise ValueError(f"{path}: not a llama.cpp profile (columns {', '.join(FIELDS)} expected)")
    return rows


def probe_reference_s(rows: Sequence[dict]) -> float:
    """The least probe time of the profile: the machine's speed at its quietest moment then."""
    probes = [float(r["probe_s"]) for r in rows if r.get("probe_s") not in (None, "", "nan")]
    return min(probes) if probes else float("nan")


def read_points(path: Path | str = PROFILE_CSV) -> list[CalibrationPoint]:
    """The profile's batch points, each with its net time (wall x CPU share x the probe's
    least / its time at the point: on a quiet core of its own) as ``gpu_s``."""
    rows = read_rows(path)
    ref = probe_reference_s(rows)

    def quiet(r) -> float:
        probe = float(r.get("probe_s") or "nan")
        return ref / probe if probe == probe and ref == ref else 1.0

    return [CalibrationPoint(r["phase"], r["label"], int(r["prefill_tokens"]), int(r["prefill_attn_pairs"]),
                             int(r["decode_seqs"]), int(r["decode_ctx_tokens"]),
                             float(r["wall_s"]) * float(r["run_share"]) * quiet(r), 0.0, 0.0)
            for r in rows if r["phase"] in ("prefill", "decode")]


def frontend_delay_s(path: Path | str = PROFILE_CSV) -> float | None:
    """The profile's lone-request TTFT beyond the server's prompt time (None: not measured)."""
    rows = [r for r in read_rows(path) if r["phase"] == "frontend"]
    return float(rows[0]["wall_s"]) if rows else None
