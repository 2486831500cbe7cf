"""Calibrate the iteration-time model against Vidur's GPU profiles; fit the V100 preset.

Why: the simulator's latencies are only as good as its coefficients. ``vidur_profiles.py``
rebuilds vLLM step times from Vidur's per-operator profiles; this script fits the
:class:`~llm_lb_gym.sim.latency.LatencyModel` GPU terms to them (the roofline knee by a 1-D
search, the linear terms by non-negative least squares at each knee), the CPU terms to Vidur's
CPU-overhead table, and prints every point's error and, per regime (decode batch 1-64 x context
512-2,048; prefill chunks of 128-4,096 tokens), the median and max relative error without CPU
overhead and embedding (the GPU terms against Vidur's GPU sum) and with them (the whole model
against GPU + embedding + CPU). The V100 preset has no profile: ``paper_v100.py`` fits it to the
paper's three figures (grad1, 17 s, 31 s).

Run: ``python -m experiments.calibrate [--data-dir DIR] [--preset NAME ...] [--weighting W]``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import nnls

from llm_lb_gym._validate import check_choice
from llm_lb_gym.sim.latency import LatencyModel

from . import paper_v100
from .vidur_profiles import (CPU_OVERHEAD_COLUMNS, CPU_OVERHEAD_MODEL, CalibrationPoint, CpuOverheads,
                             attention_transfer, decode_attention_fit, load_attention_medians,
                             load_cpu_overheads, profile_path, profile_step_times)

WEIGHTINGS = ("relative", "absolute")
PRESET_PROFILES: dict[str, tuple[str, str]] = {
    "llama2-7b-a100": ("a100", "llama2-7b"),
    "llama3-8b-a100": ("a100", "llama3-8b"),
    "llama2-7b-h100": ("h100", "llama2-7b"),
}
"""Presets fitted to a profile: (gpu, model) of ``vidur_profiles.profile_step_times``."""
FITTED_PRESETS = tuple(PRESET_PROFILES)
DERIVED_PRESETS = ("llama2-7b-v100",)
KNEE_GRID = tuple(range(0, 1025))
"""Candidate knees (batched tokens): the profiles' linear layers turn compute bound at ~100-400."""
PHASES = ("decode", "prefill")
GPU_TERMS = ("base_s", "token_s", "compute_token_s", "prefill_attn_s", "decode_seq_s", "decode_ctx_s")
"""The linear GPU coefficients, in the order of :func:`gpu_features`' columns."""


def gpu_features(points: Sequence[CalibrationPoint], knee: float) -> np.ndarray:
    """Multipliers of the GPU terms (:data:`GPU_TERMS`) at a given knee, one row per point."""
    n = np.array([p.batched_tokens for p in points], dtype=float)
    return np.column_stack([
        np.ones(len(points)), n, np.maximum(n - knee, 0.0),
        [p.prefill_attn_pairs for p in points], [p.decode_seqs for p in points],
        [p.decode_ctx_tokens for p in points]]).astype(float)


def _weights(points: Sequence[CalibrationPoint], y: np.ndarray, weighting: str) -> np.ndarray:
    """Relative: rows / measured, each regime weighing the same in total (there are twice as
    many prefill points as decode points); absolute: plain rows."""
    if weighting == "absolute":
        return np.ones_like(y)
    phases = [p.phase for p in points]
    counts = {ph: phases.count(ph) for ph in set(phases)}
    balance = np.array([math.sqrt(len(points) / (len(counts) * counts[ph])) for ph in phases])
    return balance / y


def fit_gpu_terms(points: Sequence[CalibrationPoint], weighting: str = "relative",
                  knee_grid: Sequence[float] = KNEE_GRID) -> LatencyModel:
    """GPU coefficients fitted to the points' GPU time (no CPU, no embedding).

    For each candidate knee, non-negative least squares on the weighted rows (columns scaled to
    unit maximum first: they span 1 to 1e7 and NNLS's active-set steps are sensitive to that);
    the knee with the least weighted residual wins (the smallest on ties).
    """
    check_choice("weighting", weighting, WEIGHTINGS)
    y = np.array([p.measured_s(False) for p in points])
    w = _weights(points, y, weighting)
    best = None
    for knee in knee_grid:
        a = gpu_features(points, knee)
        scale = np.where(a.max(axis=0) > 0, a.max(axis=0), 1.0)
        coef, res = nnls(a * w[:, None] / scale, y * w)
        if best is None or res < best[0] - 1e-15:
            best = (res, knee, coef / scale)
    _, knee, c = best
    return LatencyModel(**dict(zip(GPU_TERMS, map(float, c))), knee_tokens=float(knee))


def fit_cpu_terms(cpu: CpuOverheads) -> tuple[float, float]:
    """(cpu_base_s, cpu_seq_s): the least-squares line of the CPU overhead over batch size."""
    return cpu.intercept_ms / 1e3, cpu.slope_ms / 1e3


def predicted_s(model: LatencyModel, p: CalibrationPoint) -> float:
    return model.iteration_s(p.prefill_tokens, p.prefill_attn_pairs, p.decode_seqs, p.decode_ctx_tokens,
                             prefill_seqs=1 if p.phase == "prefill" else 0)


@dataclass(frozen=True)
class FitReport:
    """A fitted preset against its profile points."""

    preset: str
    model: LatencyModel
    """GPU and CPU terms."""
    points: tuple[CalibrationPoint, ...]
    weighting: str

    def rel_errors(self, phase: str | None = None, with_cpu: bool = False) -> np.ndarray:
        """predicted / measured - 1; ``with_cpu`` False: GPU terms vs Vidur's GPU sum; True: the
        whole model vs GPU + embedding + CPU overhead."""
        m = self.model if with_cpu else self.model.without_cpu()
        return np.array([predicted_s(m, p) / p.measured_s(with_cpu) - 1.0 for p in self.points
                         if phase is None or p.phase == phase])

    def summary(self, phase: str, with_cpu: bool = False) -> tuple[float, float]:
        """(median, max) |relative error| over the phase's points."""
        e = np.abs(self.rel_errors(phase, with_cpu))
        return float(np.median(e)), float(e.max())


def round_sig(x: float, digits: int = 4) -> float:
    """Round to significant digits, as the presets store them."""
    return 0.0 if x == 0 else round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def rounded(model: LatencyModel, digits: int = 4) -> LatencyModel:
    return LatencyModel(**{k: v if isinstance(v, int) else round_sig(v, digits) for k, v in vars(model).items()})


def fmt(m: LatencyModel) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in vars(m).items())


def _pct(pair: tuple[float, float]) -> str:
    return f"{pair[0] * 100:.1f}% / {pair[1] * 100:.1f}%"


# ---------------------------------------------------------------------------------------------
# Entry point


@dataclass(frozen=True)
class Calibration:
    fits: dict[str, FitReport]
    derived: dict[str, LatencyModel]


def fit_preset(name: str, cpu: CpuOverheads, weighting: str = "relative",
               data_dir: Path | str | None = None) -> FitReport:
    """Fit one profiled preset: GPU terms to its profile, CPU terms to the CPU table."""
    gpu, model = PRESET_PROFILES[name]
    points = tuple(profile_step_times(gpu, model, 1, data_dir))
    cpu_base_s, cpu_seq_s = fit_cpu_terms(cpu)
    fitted = replace(fit_gpu_terms(points, weighting), cpu_base_s=cpu_base_s, cpu_seq_s=cpu_seq_s)
    return FitReport(name, fitted, points, weighting)


def calibrate(data_dir: Path | str | None = None, presets: Sequence[str] = FITTED_PRESETS + DERIVED_PRESETS,
              weighting: str = "relative", log: Callable[[str], None] = print) -> Calibration:
    """Fit each requested preset from the profiles (and the V100 one from the paper); print all."""
    for name in presets:
        check_choice("preset", name, FITTED_PRESETS + DERIVED_PRESETS)
    check_choice("weighting", weighting, WEIGHTINGS)
    attention = load_attention_medians(profile_path("vidur_a100_llama2_7b_attention_medians", data_dir))
    cpu = load_cpu_overheads(profile_path("vidur_a100_cpu_overheads", data_dir))
    log(f"CPU overheads: {CPU_OVERHEAD_MODEL} TP1 (A100 host), sum of {', '.join(CPU_OVERHEAD_COLUMNS)};"
        f" least-squares line {cpu.intercept_ms:.4f} + {cpu.slope_ms:.5f} x batch ms -> cpu_base_s, "
        f"cpu_seq_s (the table is used as measured for batch 8-128, the line below 8); the same "
        f"table for every preset (only 7B TP1 is profiled).")
    a, b, c = decode_attention_fit(attention)
    log(f"decode attention per layer (Llama-2 A100) ~ {a:.4f} + {b:.5f} x batch + {c:.3e} x batch x context ms"
        " (absolute NNLS; only its KV term is used: GQA scaling)")
    wanted = set(presets) | ({"llama2-7b-a100"} if "llama2-7b-v100" in presets else set())
    fits: dict[str, FitReport] = {}
    for name in (n for n in FITTED_PRESETS if n in wanted):
        fits[name] = fit_preset(name, cpu, weighting, data_dir)
        _print_fit(fits[name], attention_transfer(*PRESET_PROFILES[name]).note, log)
        other = "absolute" if weighting == "relative" else "relative"
        alt = FitReport(name, replace(fit_gpu_terms(fits[name].points, other), cpu_base_s=fits[name].model.cpu_base_s,
                                      cpu_seq_s=fits[name].model.cpu_seq_s), fits[name].points, other)
        log(f"  ({other}-error NNLS for comparison, without CPU: decode median/max "
            f"{_pct(alt.summary('decode'))}, prefill {_pct(alt.summary('prefill'))})")
    derived: dict[str, LatencyModel] = {}
    if "llama2-7b-v100" in presets:
        log("\n== llama2-7b-v100 (no V100 profile: fitted to the paper's three figures) ==")
        derived["llama2-7b-v100"] = paper_v100.derive_v100(fits["llama2-7b-a100"].model, log)
        paper_v100.explain_grad2(derived["llama2-7b-v100"], log)
    log("\n== rounded presets (4 significant digits) ==")
    for name, model in [(n, f.model) for n, f in fits.items()] + list(derived.items()):
        log(f"  {name}: {fmt(rounded(model))}")
    return Calibration(fits, derived)


def _print_fit(rep: FitReport, note: str, log: Callable[[str], None]) -> None:
    gpu_only = rep.model.without_cpu()
    log(f"\n== {rep.preset} ==\n  attention: {note}\n  fit: {rep.weighting}-error NNLS at each knee, "
        f"best knee {rep.model.knee_tokens:.0f} -> {fmt(rep.model)}")
    log(f"  {'point':<34}{'GPU ms':>9}{'model':>9}{'err':>8}{'all-in ms':>11}{'model':>9}{'err':>8}")
    for p in rep.points:
        g, gm = p.measured_s(False), predicted_s(gpu_only, p)
        a, am = p.measured_s(True), predicted_s(rep.model, p)
        log(f"  {p.label:<34}{g * 1e3:>9.2f}{gm * 1e3:>9.2f}{gm / g - 1:>+8.1%}"
            f"{a * 1e3:>11.2f}{am * 1e3:>9.2f}{am / a - 1:>+8.1%}")
    for with_cpu, what in ((False, "without CPU overhead and embedding"), (True, "with CPU overhead and embedding")):
        log(f"  {what}: decode (batch 1-64 x context 512-2,048) median/max |rel err| "
            f"{_pct(rep.summary('decode', with_cpu))}; prefill (128-4,096 tokens) "
            f"{_pct(rep.summary('prefill', with_cpu))}")


def main(argv: Sequence[str] | None = None) -> Calibration:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="folder holding profiling/vidur/ (default: the registered datasets, found "
                         "and checked by llm_lb_gym.data: $LLM_LB_GYM_DATA, ../shared/data or the "
                         "user cache)")
    ap.add_argument("--preset", action="append", choices=FITTED_PRESETS + DERIVED_PRESETS,
                    help="preset to calibrate (repeatable; default: all)")
    ap.add_argument("--weighting", choices=WEIGHTINGS, default="relative",
                    help="least squares on relative (default) or absolute errors")
    args = ap.parse_args(argv)
    return calibrate(args.data_dir, args.preset or FITTED_PRESETS + DERIVED_PRESETS, args.weighting)


if __name__ == "__main__":
    main()
