"""Calibrate the iteration-time model against Vidur's GPU profiles; fit the V100 preset.

Why: the simulator's latencies are only as good as its coefficients. ``vidur_profiles.py``
rebuilds vLLM step times from Vidur's per-operator profiles; this script fits the
:class:`~llm_lb_gym.sim.latency.LatencyModel` GPU terms to them (GEMM tile and roofline knee
by a grid search, the linear terms, a token price per octave among them, by non-negative least
squares at each), the CPU terms to Vidur's CPU-overhead table, and prints every point's error
and, per regime (decode batch 1-64 x context 512-2,048; prefill chunks of 128-4,096 tokens), the
median and max relative error without CPU overhead and embedding (the GPU terms against Vidur's
GPU sum) and with them (the whole model against GPU + embedding + CPU), and the error at whole
prompts every 64 tokens between the profiled shapes, in the fit and held out. The V100 preset has no profile: ``paper_v100.py`` fits it to the
paper's three figures (grad1, 17 s, 31 s).

Run: ``python -m llm_lb_gym.experiments.calibrate [--data-dir DIR] [--preset NAME ...] [--weighting W] [--bound]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import nnls

from llm_lb_gym._validate import check_choice
from llm_lb_gym.sim.latency import LatencyModel

from . import paper_v100
from .vidur_profiles import (CPU_OVERHEAD_COLUMNS, CPU_OVERHEAD_MODEL, DATASHEETS, SMALL_BATCH_SEQS, CalibrationPoint,
                             CpuOverheads, dense_prefill_points,
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
TILE_GRID = (1, 16, 32, 64, 128, 256)
"""Candidate GEMM tile rows (``LatencyModel.tile_tokens``): the M-tile sizes cuBLAS kernels use."""
RIDGE_FACTOR = 2
"""A preset's knee is searched from 0 to this x its GPU's datasheet ridge point (FP16 FLOPs per
byte of bandwidth = the tokens at which reading fp16 weights and multiplying them take equally
long: A100 153, H100 295). Why: left free, the H100 fit put its knee at the grid's end (1,024)
to follow the staircase of its 22 prefill points, and between them it was off by up to 25%."""


def knee_candidates(gpu: str) -> tuple[int, ...]:
    """Candidate knees of a preset on ``gpu``: 0 to :data:`RIDGE_FACTOR` x its ridge point."""
    sheet = DATASHEETS[gpu]
    ridge = sheet.fp16_tensor_tflops * 1e12 / (sheet.memory_bandwidth_gb_s * 1e9)
    return tuple(range(0, int(RIDGE_FACTOR * ridge) + 1))


PHASES = ("decode", "prefill")
TOKEN_KNOTS = (16, 32, 64, 128, 256, 512, 1024, 2048)
"""Segment starts of the fitted token curve (``LatencyModel.token_segments``): powers of two, a
price per octave of batched tokens. Why: the linear layers' cost per token changes with N below
and above the knee (cuBLAS picks other kernels as the GEMMs grow) and not always upwards; one
price per octave follows that with non-negative prices (a monotone curve) and few coefficients."""
GPU_TERMS = ("base_s", "token_s", "compute_token_s", "prefill_attn_s", "decode_seq_s", "decode_ctx_s",
             "decode_ctx_small_s")
"""The scalar GPU coefficients. :func:`gpu_features`' columns are these, with ``token_s``
followed by one column per knot (the segments' prices)."""
BETWEEN_FOLDS = 3
"""Folds of the between-points cross-validation (:func:`cross_validated_between`)."""


def gpu_features(points: Sequence[CalibrationPoint], knee: float, tile: int = 1,
                 small_batch_seqs: int = 0, knots: Sequence[int] = ()) -> np.ndarray:
    """Multipliers of the GPU terms at a given knee, tile, small-batch range and token knots, one
    row per point (the formula of ``LatencyModel.iteration_s``): base, the tokens in each
    segment of the token curve (below the first knot: ``token_s``'s), compute, pairs, B, S,
    S on small batches."""
    lat = LatencyModel(base_s=1.0, tile_tokens=tile, small_batch_seqs=small_batch_seqs)
    n = np.array([p.batched_tokens for p in points], dtype=float)
    b = np.array([p.decode_seqs for p in points])
    ctx = np.array([p.decode_ctx_tokens for p in points], dtype=float)
    small = (b > 0) & (b <= small_batch_seqs)
    edges = (0,) + tuple(knots) + (math.inf,)
    segments = [np.clip(n - edges[j], 0.0, edges[j + 1] - edges[j]) for j in range(len(edges) - 1)]
    return np.column_stack([np.ones(len(points)), *segments, np.maximum(lat.tiled(n) - knee, 0.0),
                            [p.prefill_attn_pairs for p in points], b, ctx, ctx * small]).astype(float)


def model_from(coef: np.ndarray, knee: float, tile: int, small_batch_seqs: int,
               knots: Sequence[int] = ()) -> LatencyModel:
    """The LatencyModel of :func:`gpu_features`' coefficients."""
    c = [float(v) for v in coef]
    m = len(knots)
    scalars = dict(zip(GPU_TERMS, [c[0], c[1]] + c[2 + m:]))
    small = small_batch_seqs if scalars["decode_ctx_small_s"] > 0 else 0
    return LatencyModel(**scalars, token_segments=tuple(zip(knots, c[2:2 + m])), knee_tokens=float(knee),
                        tile_tokens=int(tile), small_batch_seqs=small)


def _weights(groups: Sequence[str], y: np.ndarray, weighting: str) -> np.ndarray:
    """Relative: rows / measured, each group (decode, prefill, between points) weighing the same
    in total (there are twice as many prefill points as decode points, three times as many
    between points as prefill points); absolute: plain rows."""
    if weighting == "absolute":
        return np.ones_like(y)
    counts = {g: list(groups).count(g) for g in set(groups)}
    balance = np.array([math.sqrt(len(groups) / (len(counts) * counts[g])) for g in groups])
    return balance / y


def fit_gpu_terms(points: Sequence[CalibrationPoint], weighting: str = "relative",
                  knee_grid: Sequence[float] = KNEE_GRID, tile_grid: Sequence[int] = TILE_GRID,
                  small_batch_seqs: int = SMALL_BATCH_SEQS, knots: Sequence[int] = TOKEN_KNOTS,
                  between: Sequence[CalibrationPoint] = ()) -> LatencyModel:
    """GPU coefficients fitted to the points' GPU time (no CPU, no embedding), and to the
    ``between`` points (whole prompts between the profiled shapes) as a third group.

    For each candidate (tile, knee), non-negative least squares on the weighted rows (columns
    scaled to unit maximum first: they span 1 to 1e7 and NNLS's active-set steps are sensitive to
    that); the pair with the least weighted residual wins (the first on ties: smaller tiles,
    then smaller knees). ``tile_grid=(1,)``, ``small_batch_seqs=0`` and ``knots=()`` fit the
    smooth formula (no tile rounding, one decode-attention price, one token price), which the
    V100 derivation starts from.
    """
    check_choice("weighting", weighting, WEIGHTINGS)
    rows = list(points) + list(between)
    y = np.array([p.measured_s(False) for p in rows])
    w = _weights([p.phase for p in points] + ["between"] * len(between), y, weighting)
    best = None
    for tile in tile_grid:
        for knee in knee_grid:
            a = gpu_features(rows, knee, tile, small_batch_seqs, knots)
            scale = np.where(a.max(axis=0) > 0, a.max(axis=0), 1.0)
            coef, res = nnls(a * w[:, None] / scale, y * w)
            if best is None or res < best[0] - 1e-15:
                best = (res, tile, knee, coef / scale)
    _, tile, knee, c = best
    return model_from(c, knee, tile, small_batch_seqs, knots)


def cross_validated_between(points: Sequence[CalibrationPoint], between: Sequence[CalibrationPoint],
                            weighting: str = "relative", knee_grid: Sequence[float] = KNEE_GRID,
                            folds: int = BETWEEN_FOLDS) -> np.ndarray:
    """Relative errors of the between points, each predicted by a fit that did not see it:
    point i is held out in fold i mod ``folds`` (neighbours land in different folds), the fit
    uses the profiled points and the other folds. Why: the between points are fit data, so their
    in-fit error says little about a prompt size no profile has; this is the honest figure."""
    err = np.empty(len(between))
    for f in range(folds):
        held = [i for i in range(len(between)) if i % folds == f]
        seen = [p for i, p in enumerate(between) if i % folds != f]
        m = fit_gpu_terms(points, weighting, knee_grid, between=seen)
        for i in held:
            err[i] = predicted_s(m, between[i]) / between[i].measured_s(False) - 1.0
    return err


def minimax_bound(points: Sequence[CalibrationPoint], knee_grid: Sequence[float] = KNEE_GRID[::4],
                  tile_grid: Sequence[int] = TILE_GRID, small_batch_seqs: int = SMALL_BATCH_SEQS,
                  knots: Sequence[int] = TOKEN_KNOTS) -> tuple[float, int, float]:
    """(least max |relative error|, tile, knee): the best any non-negative coefficients of the
    formula can do on the points' GPU time, by a linear program per (tile, knee) (minimise t
    with -t <= predicted / measured - 1 <= t). A bound above a target proves that no fit of
    this formula meets it, whatever the weighting."""
    from scipy.optimize import linprog

    y = np.array([p.measured_s(False) for p in points])
    best = (math.inf, 1, 0.0)
    for tile in tile_grid:
        for knee in knee_grid:
            r = gpu_features(points, knee, tile, small_batch_seqs, knots) / y[:, None]
            scale = np.where(r.max(axis=0) > 0, r.max(axis=0), 1.0)
            r = r / scale
            m, k = r.shape
            ones = np.ones((m, 1))
            res = linprog(np.r_[np.zeros(k), 1.0], A_ub=np.block([[r, -ones], [-r, -ones]]),
                          b_ub=np.r_[np.ones(m), -np.ones(m)], bounds=[(0, None)] * (k + 1), method="highs")
            if res.status == 0 and res.x[-1] < best[0]:
                best = (float(res.x[-1]), int(tile), float(knee))
    return best


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
    between: tuple[CalibrationPoint, ...] = ()
    """Whole prompts between the profiled shapes the fit also saw (``dense_prefill_points``)."""

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


def _round_value(v, digits: int):
    if isinstance(v, tuple):   # token_segments: (start, price) pairs
        return tuple((k, round_sig(p, digits)) for k, p in v)
    return v if isinstance(v, int) else round_sig(v, digits)


def rounded(model: LatencyModel, digits: int = 4) -> LatencyModel:
    return LatencyModel(**{k: _round_value(v, digits) for k, v in vars(model).items()})


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
    between = tuple(dense_prefill_points(gpu, model, data_dir))
    cpu_base_s, cpu_seq_s = fit_cpu_terms(cpu)
    fitted = replace(fit_gpu_terms(points, weighting, knee_candidates(gpu), between=between),
                     cpu_base_s=cpu_base_s, cpu_seq_s=cpu_seq_s)
    return FitReport(name, fitted, points, weighting, between)


def calibrate(data_dir: Path | str | None = None, presets: Sequence[str] = FITTED_PRESETS + DERIVED_PRESETS,
              weighting: str = "relative", log: Callable[[str], None] = print, bound: bool = False) -> Calibration:
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
    a, b, c, cs = decode_attention_fit(attention)
    log(f"decode attention per layer (Llama-2 A100) ~ {a:.4f} + {b:.5f} x batch + ({c:.3e} + {cs:.3e} x "
        f"[batch <= {SMALL_BATCH_SEQS}]) x batch x context ms (absolute NNLS; only its KV terms are used: "
        "GQA scaling)")
    wanted = set(presets) | ({"llama2-7b-a100"} if "llama2-7b-v100" in presets else set())
    fits: dict[str, FitReport] = {}
    for name in (n for n in FITTED_PRESETS if n in wanted):
        fits[name] = fit_preset(name, cpu, weighting, data_dir)
        _print_fit(fits[name], attention_transfer(*PRESET_PROFILES[name]).note, log)
        other = "absolute" if weighting == "relative" else "relative"
        alt = FitReport(name, replace(fit_gpu_terms(fits[name].points, other, knee_candidates(PRESET_PROFILES[name][0]),
                                                    between=fits[name].between),
                                      cpu_base_s=fits[name].model.cpu_base_s, cpu_seq_s=fits[name].model.cpu_seq_s),
                        fits[name].points, other)
        log(f"  ({other}-error NNLS for comparison, without CPU: decode median/max "
            f"{_pct(alt.summary('decode'))}, prefill {_pct(alt.summary('prefill'))})")
        between = FitReport(name, fits[name].model, fits[name].between, weighting)
        cv = np.abs(cross_validated_between(fits[name].points, fits[name].between, weighting,
                                            knee_candidates(PRESET_PROFILES[name][0])))
        log(f"  between the profiled points (whole prompts of 128-4,096 tokens every 64, attention "
            f"interpolated; fit data as a third group): median/max |rel err| without CPU "
            f"{_pct(between.summary('prefill'))}, with {_pct(between.summary('prefill', True))}; "
            f"held out ({BETWEEN_FOLDS}-fold, each predicted by a fit without it): "
            f"{_pct((float(np.median(cv)), float(cv.max())))}")
        if bound:
            for label, kw in (("this formula", {}), ("the smooth formula (no tiles, one decode price, one token price)",
                                                    dict(tile_grid=(1,), small_batch_seqs=0, knots=()))):
                t, tile, knee = minimax_bound(fits[name].points, **kw)
                log(f"  least possible max |rel err| over all points, without CPU, {label}: {t:.1%} "
                    f"(at tile {tile}, knee {knee:.0f}; a linear program per tile and knee, knees 0-1,024 in steps of 4)")
    derived: dict[str, LatencyModel] = {}
    if "llama2-7b-v100" in presets:
        log("\n== llama2-7b-v100 (no V100 profile: fitted to the paper's three figures) ==")
        a100 = fits["llama2-7b-a100"]
        smooth = FitReport("llama2-7b-a100 (smooth)", replace(
            fit_gpu_terms(a100.points, weighting, knee_candidates("a100"), tile_grid=(1,), small_batch_seqs=0, knots=()),
            cpu_base_s=a100.model.cpu_base_s, cpu_seq_s=a100.model.cpu_seq_s), a100.points, weighting)
        log("  from the smooth A100 fit (tile_tokens 1, one decode-attention price; its errors: decode "
            f"{_pct(smooth.summary('decode'))}, prefill {_pct(smooth.summary('prefill'))}): three "
            "scalar figures cannot place GEMM tiles or a kernel switch on a V100, so the V100 carries none")
        derived["llama2-7b-v100"] = paper_v100.derive_v100(smooth.model, log)
        paper_v100.explain_grad2(derived["llama2-7b-v100"], log)
    log("\n== rounded presets (4 significant digits) ==")
    for name, model in [(n, f.model) for n, f in fits.items()] + list(derived.items()):
        log(f"  {name}: {rounded(model).describe()}")
    return Calibration(fits, derived)


def _print_fit(rep: FitReport, note: str, log: Callable[[str], None]) -> None:
    gpu_only = rep.model.without_cpu()
    log(f"\n== {rep.preset} ==\n  attention: {note}\n  fit: {rep.weighting}-error NNLS at each (GEMM tile, knee), "
        f"best tile {rep.model.tile_tokens}, knee {rep.model.knee_tokens:.0f} -> {rep.model.describe()}")
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
