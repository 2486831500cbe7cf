"""The llama.cpp profile's file (where this machine's profile lies, its columns, reading and
writing) and the latency model's fit to it.

Shared by ``calibrate_llamacpp`` (which measures and fits it) and ``sim_to_real`` (which reads its
probe reference to put a replay's waits on the same quiet-core footing); entry points do not
import each other (``tests/test_entry_points.py``).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.optimize import nnls

from llm_lb_gym.calibration.calibrate import predicted_s
from llm_lb_gym.calibration.vidur_profiles import CalibrationPoint
from llm_lb_gym.experiments._contention import check_footing
from llm_lb_gym.sim.latency import LatencyModel

PROFILE_CSV = Path(__file__).with_name("profiles") / "llamacpp_smollm2_135m_q4_1_1thread.csv"
"""The committed profile of this machine (one AVX2 core, llama-cpp-python 0.3.36's llama.cpp)."""
FIELDS = ("phase", "label", "prefill_tokens", "prefill_attn_pairs", "decode_seqs", "decode_ctx_tokens",
          "wall_s", "run_share", "repeats", "probe_s", "check_prefill_s", "check_decode_s")
"""``wall_s``: the measured step time; ``run_share``: the share of the measurement during which
the server's thread was on a CPU (``/proc/PID/schedstat``; the rest it waited for one, the
machine being shared); ``probe_s``: the CPU probe bracketing the point's repeats (``_contention.bracket_reading_s``).
``check_prefill_s`` / ``check_decode_s``: the server's own speed check bracketing the point
(``_contention.server_check_s``; profiles before 2026-12-06 have none). The fit uses the step net
of waits (``wall_s x run_share``) put on the profile's footing: with checks, at the median check
speed of the profile (:func:`check_footing_s`: the cores' factor and the memory system's cost per
iteration both removed); without, ``x min(probe_s) / probe_s``, on a quiet core of its own.
Phase ``frontend`` rows hold a lone request's streamed TTFT beyond the server's prompt time;
phase ``wake`` rows (label ``wake idle <seconds> s``) a lone request's TTFT after that long idle
less its TTFT back to back, kept non-decreasing in the idle time (``calibrate_llamacpp.
wake_curve_s``; the mean over pairs of several prompt lengths since the evening of 2026-12-07,
the median of one length's rounds before, the raw difference in the earliest profiles)."""


@dataclass(frozen=True)
class Measured:
    """A profiled point: its net time (``point.gpu_s``: wall time x the share of it the server's
    thread was on a CPU, i.e. the time on a core of its own), and the raw reading."""

    point: CalibrationPoint
    wall_s: float
    run_share: float
    probe_s: float = float("nan")
    check_prefill_s: float = float("nan")
    check_decode_s: float = float("nan")


def write_points(points: Sequence[Measured], path: Path, repeats: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for m in points:
            p = m.point
            w.writerow([p.phase, p.label, p.prefill_tokens, p.prefill_attn_pairs, p.decode_seqs,
                        p.decode_ctx_tokens, f"{m.wall_s:.9f}", f"{m.run_share:.4f}", repeats, f"{m.probe_s:.9f}",
                        f"{m.check_prefill_s:.9f}", f"{m.check_decode_s:.9f}"])


def read_rows(path: Path | str = PROFILE_CSV) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    # profiles before issue 33 have no probe column, before 2026-12-06 no server checks
    needed = set(FIELDS) - {"probe_s", "check_prefill_s", "check_decode_s"}
    if not rows or needed - set(rows[0]):
        raise ValueError(f"{path}: not a llama.cpp profile (columns {', '.join(FIELDS)} expected)")
    return rows


def probe_reference_s(rows: Sequence[dict]) -> float:
    """The least probe time of the profile: the machine's speed at its quietest moment then."""
    probes = [float(r["probe_s"]) for r in rows if r.get("probe_s") not in (None, "", "nan")]
    return min(probes) if probes else float("nan")


def _float(r: dict, key: str) -> float:
    v = r.get(key)
    return float(v) if v not in (None, "") else float("nan")


def check_reference_s(rows: Sequence[dict]) -> tuple[float, float] | None:
    """The profile's footing for server checks: the median (seconds per prompt token, seconds
    per one-stream decode step) over its points; None if it has no checks (older profiles).
    Why the median and not the least, as for the probe: a replay's check is divided by it, so
    any fixed reference serves, and the median is the one a single odd check moves least."""
    pairs = [(_float(r, "check_prefill_s"), _float(r, "check_decode_s")) for r in rows
             if r["phase"] in ("prefill", "decode")]
    pairs = [p for p in pairs if p[0] == p[0] and p[1] == p[1]]
    if not pairs:
        return None
    return float(np.median([p[0] for p in pairs])), float(np.median([p[1] for p in pairs]))


FOOTINGS = ("check", "probe")
"""How a profile's points are put on one speed (``read_points``): by the server's own checks
bracketing each point, or by the CPU probe's (``_contention.py``)."""


def read_points(path: Path | str = PROFILE_CSV, footing: str | None = None) -> list[CalibrationPoint]:
    """The profile's batch points, each with its net time (wall x CPU share) on the profile's
    footing as ``gpu_s``: ``footing`` "check" (the default when the profile has server checks):
    at the median check speed of the profile (the point's compute factor divided out and the
    memory system's cost per iteration beyond it taken off, ``_contention.check_footing``);
    "probe" (the default otherwise): x the probe's least / its time at the point, a quiet core."""
    rows = read_rows(path)
    ref_check = check_reference_s(rows)
    footing = footing or ("check" if ref_check else "probe")
    if footing not in FOOTINGS:
        raise ValueError(f"read_points: footing={footing!r}; allowed: {', '.join(FOOTINGS)}")
    if footing == "check" and ref_check is None:
        raise ValueError(f"{path}: footing 'check' needs the server checks (check_prefill_s, check_decode_s), "
                         "which profiles written before 2026-12-06 lack; allowed: footing 'probe' for it")
    ref = probe_reference_s(rows)

    def on_footing(r, net: float) -> float:
        if footing == "check":
            compute, extra = check_footing(_float(r, "check_prefill_s"), _float(r, "check_decode_s"), *ref_check)
            if net - extra <= 0:
                raise ValueError(f"{path}: point {r['label']!r} took {net * 1e3:.2f} ms, less than the "
                                 f"{extra * 1e3:.2f} ms per iteration its server checks add to the profile's "
                                 "footing: the checks and the point disagree; allowed: footing 'probe'")
            return (net - extra) / compute
        probe = _float(r, "probe_s")
        return net * (ref / probe if probe == probe and ref == ref else 1.0)

    return [CalibrationPoint(r["phase"], r["label"], int(r["prefill_tokens"]), int(r["prefill_attn_pairs"]),
                             int(r["decode_seqs"]), int(r["decode_ctx_tokens"]),
                             on_footing(r, float(r["wall_s"]) * float(r["run_share"])), 0.0, 0.0)
            for r in rows if r["phase"] in ("prefill", "decode")]


def frontend_delay_s(path: Path | str = PROFILE_CSV) -> float | None:
    """The profile's lone-request TTFT beyond the server's prompt time (None: not measured)."""
    rows = [r for r in read_rows(path) if r["phase"] == "frontend"]
    return float(rows[0]["wall_s"]) if rows else None


def wake_points(path: Path | str = PROFILE_CSV) -> tuple[tuple[float, float], ...]:
    """The profile's ``wake`` rows as the frontend's ``wake_s`` points ((idle seconds, extra
    seconds), back to back = (0, 0) first); empty if the profile has none (older profiles)."""
    rows = [r for r in read_rows(path) if r["phase"] == "wake"]
    if not rows:
        return ()
    pts = []
    for r in rows:
        m = re.fullmatch(r"wake idle ([0-9.eE+-]+) s", r["label"])
        if m is None:
            raise ValueError(f"{path}: wake row label {r['label']!r}; expected 'wake idle <seconds> s'")
        pts.append((float(m.group(1)), max(float(r["wall_s"]), 0.0)))
    return ((0.0, 0.0),) + tuple(sorted(pts))


@dataclass(frozen=True)
class LlamaCppFit:
    model: LatencyModel
    points: tuple[CalibrationPoint, ...]

    def rel_errors(self, phase: str | None = None, model: LatencyModel | None = None) -> np.ndarray:
        m = model or self.model
        return np.array([predicted_s(m, p) / p.gpu_s - 1.0 for p in self.points if phase in (None, p.phase)])


FIT_TERMS = ("base_s", "token_s", "prefill_attn_s", "decode_seq_s", "decode_ctx_s", "cpu_seq_s")
"""The terms fitted. ``cpu_seq_s`` (per sequence in the batch, prompts included) carries what
every sequence that yields a token pays on llama.cpp: its LM-head row (49,152 x 576) and the
sampler over the vocabulary; ``decode_seq_s`` what only decodes add. No knee, tiles, token
segments or small-batch decode price: a CPU core has none of the GPU kernels' regimes, and this
profile could not place them above its noise."""
MIN_BASE_S = 1e-6
"""``LatencyModel`` needs ``base_s`` > 0 (every iteration takes time); a fit that finds no
per-iteration floor beyond the per-token and per-sequence costs gets this 1 us instead of 0."""


def features(points: Sequence[CalibrationPoint]) -> np.ndarray:
    """Multipliers of :data:`FIT_TERMS` per point (the formula of ``LatencyModel.iteration_s``)."""
    return np.array([[1.0, p.prefill_tokens + p.decode_seqs, p.prefill_attn_pairs, p.decode_seqs,
                      p.decode_ctx_tokens, (1 if p.prefill_tokens else 0) + p.decode_seqs]
                     for p in points], dtype=float)


def fit(points: Sequence[CalibrationPoint]) -> LlamaCppFit:
    """Non-negative least squares on relative error, the two phases weighing alike (columns
    scaled to unit maximum first, as ``llm_lb_gym.calibration.calibrate.fit_gpu_terms`` does)."""
    a = features(points)
    y = np.array([p.gpu_s for p in points])
    phases = [p.phase for p in points]
    balance = np.array([1.0 / phases.count(ph) for ph in phases])
    w = np.sqrt(balance) / y
    scale = np.where(a.max(axis=0) > 0, a.max(axis=0), 1.0)
    coef, _ = nnls(a * w[:, None] / scale, y * w)
    c = dict(zip(FIT_TERMS, (float(v) for v in coef / scale)))
    c["base_s"] = max(c["base_s"], MIN_BASE_S)
    return LlamaCppFit(LatencyModel(**c), tuple(points))
