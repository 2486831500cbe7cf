"""Calibrate the iteration-time model against Vidur's GPU profiles; derive the V100 preset.

Why: the simulator's latencies are only as good as its coefficients. Vidur (MIT) profiled vLLM's
kernels per operator on A100/H100; a batch's step time is ``layers x (sum of per-layer operator
times) + CPU overheads`` (Vidur's ``ExecutionTime.total_time``; we also count the embedding once).
This script rebuilds those step times for prefill-only and decode-only batches, fits the five
non-negative coefficients of :class:`~llm_lb_gym.sim.latency.LatencyModel`, prints every point's
error, and derives the paper's V100 setting (no V100 profile exists) from the A100 fit, hardware
ratios and the paper's two numbers (grad1 = 3.2e-4 s/token; p = d = 1,000 alone takes 17 s).

Run: ``python -m experiments.calibrate [--data-dir DIR] [--preset NAME ...] [--weighting W]``.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import nnls

from llm_lb_gym._validate import check_choice
from llm_lb_gym.sim.latency import LatencyModel

NUM_LAYERS = 32
"""Llama-2-7B and Llama-3-8B both have 32 decoder layers."""
PER_LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
                 "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
"""Non-attention operators of one layer, as Vidur's ``_get_block_execution_time`` sums them."""
CPU_OVERHEAD_COLUMNS = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median",
                        "process_model_outputs_median", "ray_comm_time_mean")
"""Vidur's ``_get_cpu_overhead`` terms (ray_comm_time has only a mean column)."""
CPU_OVERHEAD_MODEL = "meta-llama/Llama-2-7b-hf"
"""The only 7-8B model with CPU overheads in the file (TP1, A100 host); used for every preset."""
WEIGHTINGS = ("relative", "absolute")
FITTED_PRESETS = ("llama2-7b-a100", "llama3-8b-a100", "llama2-7b-h100")
DERIVED_PRESETS = ("llama2-7b-v100",)

PAPER_GRAD1_S = 3.2e-4
"""Paper's V100 prefill slope, seconds per prompt token."""
PAPER_GRAD2_S = 3.3e-5
"""Paper's V100 decode gradient, 'per token'."""
PAPER_ISOLATED = (1000, 1000, 17.0)
"""Paper: one request with prompt 1,000 and output 1,000 tokens alone takes 17 s on V100."""


@dataclass(frozen=True)
class GPUThroughput:
    """Datasheet peaks used to transfer times between GPUs."""

    sku: str
    memory_bandwidth_gb_s: float
    fp16_tensor_tflops: float
    """Dense FP16 tensor-core peak (no sparsity)."""


DATASHEETS: dict[str, GPUThroughput] = {
    # Vidur's a100 device is the 80 GB part (as GPUS["a100"] in latency.py assumes).
    "a100": GPUThroughput("A100 80GB SXM4", 2039.0, 312.0),
    "h100": GPUThroughput("H100 80GB SXM5", 3352.0, 989.4),
    "v100": GPUThroughput("V100 32GB SXM2", 900.0, 125.0),
}


def bandwidth_ratio(src: str, dst: str) -> float:
    """Time factor src -> dst of a memory-bound kernel."""
    return DATASHEETS[src].memory_bandwidth_gb_s / DATASHEETS[dst].memory_bandwidth_gb_s


def flops_ratio(src: str, dst: str) -> float:
    """Time factor src -> dst of a compute-bound kernel."""
    return DATASHEETS[src].fp16_tensor_tflops / DATASHEETS[dst].fp16_tensor_tflops


# ---------------------------------------------------------------------------------------------
# Loaders


@dataclass(frozen=True)
class OperatorProfile:
    """Per-layer sum of the non-attention operators' medians (ms) against num_tokens, TP1."""

    num_tokens: np.ndarray
    per_layer_ms: np.ndarray
    embedding_ms: np.ndarray
    kv_heads: int
    query_heads: int

    def step_ms(self, num_tokens: float) -> float:
        """All layers' non-attention time plus one embedding lookup, linearly interpolated."""
        per_layer = float(np.interp(num_tokens, self.num_tokens, self.per_layer_ms))
        return NUM_LAYERS * per_layer + float(np.interp(num_tokens, self.num_tokens, self.embedding_ms))


def load_operator_profile(path: Path) -> OperatorProfile:
    """Read Vidur's mlp.csv, keep TP1, average duplicate num_tokens rows."""
    sums: dict[int, list[tuple[float, float]]] = {}
    heads: set[tuple[int, int]] = set()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if int(row["num_tensor_parallel_workers"]) != 1:
                continue
            layer = sum(float(row[f"time_stats.{op}.median"]) for op in PER_LAYER_OPS)
            sums.setdefault(int(row["num_tokens"]), []).append(
                (layer, float(row["time_stats.emb.median"])))
            heads.add((int(row["n_head"]), int(row["n_kv_head"])))
    if not sums or len(heads) != 1:
        raise ValueError(f"{path}: expected TP1 rows of one model, got heads {sorted(heads)}")
    tokens = np.array(sorted(sums), dtype=float)
    means = np.array([np.mean(sums[int(n)], axis=0) for n in tokens])
    (q_heads, kv_heads), = heads
    return OperatorProfile(tokens, means[:, 0], means[:, 1], kv_heads, q_heads)


@dataclass(frozen=True)
class AttentionPoint:
    """One profiled attention median (ms per layer) of Llama-2-7B on A100."""

    phase: str
    """'prefill' (one sequence's chunk) or 'decode' (a batch of equal-length sequences)."""
    query_tokens: int
    """Prefill: chunk tokens. Decode: batch size."""
    context_tokens: int
    """Prefill: cached prefix tokens before the chunk. Decode: context length per sequence."""
    attention_ms: float
    reshape_ms: float


_DECODE_LINE = re.compile(r"^decode kv=(\d+):(.*)$")
_DECODE_ITEM = re.compile(r"bs(\d+)\s+([\d.]+)(?:/([\d.]+))?")
_PREFILL_ITEM = re.compile(r"chunk(\d+)\s+kv(\d+):\s*([\d.]+)(?:\s+and\s+([\d.]+))?\s*(?:/([\d.]+))?")


def load_attention_medians(path: Path) -> list[AttentionPoint]:
    """Parse the hand-extracted medians; fill missing reshape times by interpolation.

    The output reshape depends only on the query tokens (chunk or batch size), so a row without
    it borrows the value interpolated from same-phase rows that list it. Parenthesised notes are
    dropped (one repeats the kv=1984 row); duplicate profiled rows are averaged.
    """
    raw: list[tuple[str, int, int, float, float | None]] = []
    for line in Path(path).read_text().splitlines():
        line = re.sub(r"\([^)]*\)", " ", line.split("#", 1)[0]).strip()
        m = _DECODE_LINE.match(line)
        if m:
            for bs, t, r in _DECODE_ITEM.findall(m.group(2)):
                raw.append(("decode", int(bs), int(m.group(1)), float(t), float(r) if r else None))
            continue
        for chunk, kv, t, dup, r in _PREFILL_ITEM.findall(line):
            times = [float(t)] + ([float(dup)] if dup else [])
            raw.append(("prefill", int(chunk), int(kv), float(np.mean(times)), float(r) if r else None))
    points = []
    for phase in ("decode", "prefill"):
        known = sorted({(q, r) for p, q, _, _, r in raw if p == phase and r is not None})
        if not known:
            raise ValueError(f"{path}: no {phase} rows with an output-reshape time")
        xs, ys = zip(*known)
        for p, q, kv, t, r in raw:
            if p == phase:
                points.append(AttentionPoint(p, q, kv, t, r if r is not None else float(np.interp(q, xs, ys))))
    return points


@dataclass(frozen=True)
class CpuOverheads:
    """Per-iteration CPU overhead (ms) against batch size (sequences)."""

    batch_sizes: np.ndarray
    total_ms: np.ndarray
    intercept_ms: float
    slope_ms: float
    """Least-squares line over the table; used outside the profiled batch sizes."""

    def at(self, batch_size: int) -> float:
        if self.batch_sizes[0] <= batch_size <= self.batch_sizes[-1]:
            return float(np.interp(batch_size, self.batch_sizes, self.total_ms))
        return self.intercept_ms + self.slope_ms * batch_size


def load_cpu_overheads(path: Path, model: str = CPU_OVERHEAD_MODEL) -> CpuOverheads:
    """Vidur's CPU overhead terms summed per row; TP1 rows of ``model``, duplicates averaged."""
    by_bs: dict[int, list[float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["model_name"] == model and int(row["tensor_parallel_degree"]) == 1:
                total = sum(float(row[c] or 0.0) for c in CPU_OVERHEAD_COLUMNS)
                by_bs.setdefault(int(row["batch_size"]), []).append(total)
    if len(by_bs) < 2:
        raise ValueError(f"{path}: fewer than two TP1 batch sizes for {model}")
    bs = np.array(sorted(by_bs), dtype=float)
    tot = np.array([np.mean(by_bs[int(b)]) for b in bs])
    slope, intercept = np.polyfit(bs, tot, 1)
    return CpuOverheads(bs, tot, float(intercept), float(slope))


# ---------------------------------------------------------------------------------------------
# Measured points and the fit


@dataclass(frozen=True)
class CalibrationPoint:
    """A batch composition and its step time rebuilt from the profiles."""

    phase: str
    label: str
    prefill_tokens: int
    prefill_attn_pairs: int
    decode_seqs: int
    decode_ctx_tokens: int
    measured_s: float

    def features(self) -> np.ndarray:
        """Multipliers of (base, prefill_token, prefill_attn, decode_seq, decode_ctx)."""
        return np.array([1.0, self.prefill_tokens, self.prefill_attn_pairs, self.decode_seqs,
                         self.decode_ctx_tokens], dtype=float)


@dataclass(frozen=True)
class AttentionTransfer:
    """How Llama-2-7B-on-A100 attention medians become another (model, GPU)'s."""

    prefill_factor: float
    decode_factor: float
    decode_kv_factor: float
    """Factor on the KV-read part only (GQA reads fewer KV heads); 1 for Llama-2."""
    note: str


def decode_attention_fit(points: Sequence[AttentionPoint]) -> np.ndarray:
    """Non-negative (a, b, c) of per-layer decode attention ~ a + b*batch + c*batch*context (ms).

    Only the c term (bytes of KV read) shrinks with fewer KV heads; a and b are launch and
    per-sequence work that GQA does not change.
    """
    dec = [p for p in points if p.phase == "decode"]
    a = np.array([[1.0, p.query_tokens, p.query_tokens * p.context_tokens] for p in dec])
    t = np.array([p.attention_ms for p in dec])
    scale = a.max(axis=0)
    coef, _ = nnls(a / scale, t)
    return coef / scale


def build_points(ops: OperatorProfile, attention: Sequence[AttentionPoint], cpu: CpuOverheads,
                 transfer: AttentionTransfer) -> list[CalibrationPoint]:
    """Step times at every profiled attention shape: prefill of one chunk, or a decode batch."""
    kv_c = decode_attention_fit(attention)[2]
    out = []
    for p in attention:
        if p.phase == "prefill":
            attn = (p.attention_ms + p.reshape_ms) * transfer.prefill_factor
            ms = ops.step_ms(p.query_tokens) + NUM_LAYERS * attn + cpu.at(1)
            out.append(CalibrationPoint(
                "prefill", f"prefill chunk={p.query_tokens} prefix={p.context_tokens}",
                p.query_tokens, p.query_tokens * (p.context_tokens + p.query_tokens), 0, 0, ms / 1e3))
        else:
            kv_part = kv_c * p.query_tokens * p.context_tokens
            attn = (p.attention_ms - kv_part * (1.0 - transfer.decode_kv_factor) + p.reshape_ms)
            if attn <= 0:
                raise ValueError(f"{p}: transferred decode attention {attn:.4f} ms is not positive")
            ms = ops.step_ms(p.query_tokens) + NUM_LAYERS * attn * transfer.decode_factor \
                + cpu.at(p.query_tokens)
            out.append(CalibrationPoint(
                "decode", f"decode batch={p.query_tokens} context={p.context_tokens}",
                0, 0, p.query_tokens, p.query_tokens * p.context_tokens, ms / 1e3))
    return out


def fit_latency_model(points: Sequence[CalibrationPoint], weighting: str = "relative") -> LatencyModel:
    """Non-negative least squares on relative (rows / measured) or absolute errors.

    Columns are scaled to unit maximum first: they span 1 to 1e7 and NNLS's active-set steps
    are sensitive to that.
    """
    check_choice("weighting", weighting, WEIGHTINGS)
    a = np.array([p.features() for p in points])
    y = np.array([p.measured_s for p in points])
    w = 1.0 / y if weighting == "relative" else np.ones_like(y)
    scale = np.where(a.max(axis=0) > 0, a.max(axis=0), 1.0)
    coef, _ = nnls(a * w[:, None] / scale, y * w)
    c = coef / scale
    return LatencyModel(base_s=c[0], prefill_token_s=c[1], prefill_attn_s=c[2],
                        decode_seq_s=c[3], decode_ctx_s=c[4])


@dataclass(frozen=True)
class FitReport:
    preset: str
    model: LatencyModel
    points: tuple[CalibrationPoint, ...]
    weighting: str

    def predicted_s(self, p: CalibrationPoint) -> float:
        return self.model.iteration_s(p.prefill_tokens, p.prefill_attn_pairs, p.decode_seqs,
                                      p.decode_ctx_tokens)

    def rel_errors(self, phase: str | None = None) -> np.ndarray:
        return np.array([self.predicted_s(p) / p.measured_s - 1.0 for p in self.points
                         if phase is None or p.phase == phase])

    def summary(self, phase: str) -> tuple[float, float]:
        """(mean, max) |relative error| over the phase's points."""
        e = np.abs(self.rel_errors(phase))
        return float(e.mean()), float(e.max())


def round_sig(x: float, digits: int = 4) -> float:
    """Round to significant digits, as the presets store them."""
    return 0.0 if x == 0 else round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def rounded(model: LatencyModel, digits: int = 4) -> LatencyModel:
    return LatencyModel(**{k: round_sig(v, digits) for k, v in vars(model).items()})


# ---------------------------------------------------------------------------------------------
# V100 derivation


def derive_v100(a100: LatencyModel, log: Callable[[str], None] = print) -> LatencyModel:
    """Scale the Llama-2-7B A100 fit to V100, then pin the paper's grad1 and 17 s request."""
    bw, fl = bandwidth_ratio("a100", "v100"), flops_ratio("a100", "v100")
    log(f"  step 1  A100 fit: {_fmt(a100)}")
    log(f"  step 2  memory-bound terms x {DATASHEETS['a100'].memory_bandwidth_gb_s:.0f}/"
        f"{DATASHEETS['v100'].memory_bandwidth_gb_s:.0f} GB/s = {bw:.4f} (base, decode_seq, decode_ctx);"
        f" compute-bound x {DATASHEETS['a100'].fp16_tensor_tflops:.0f}/"
        f"{DATASHEETS['v100'].fp16_tensor_tflops:.0f} TFLOPS = {fl:.4f} (prefill_token, prefill_attn)")
    scaled = LatencyModel(base_s=a100.base_s * bw, prefill_token_s=a100.prefill_token_s * fl,
                          prefill_attn_s=a100.prefill_attn_s * fl, decode_seq_s=a100.decode_seq_s * bw,
                          decode_ctx_s=a100.decode_ctx_s * bw)
    p, d, target = PAPER_ISOLATED
    log(f"          -> {_fmt(scaled)}; isolated_request_s({p},{d}) = {scaled.isolated_request_s(p, d):.3f} s")
    pinned = replace(scaled, prefill_token_s=PAPER_GRAD1_S)
    log(f"  step 3  pin prefill_token_s = paper grad1 {PAPER_GRAD1_S:.2e} "
        f"(x{PAPER_GRAD1_S / scaled.prefill_token_s:.3f} the ratio-scaled {scaled.prefill_token_s:.3e});"
        f" isolated = {pinned.isolated_request_s(p, d):.3f} s")
    # isolated = prefill-only part + k * (part linear in base/decode_seq/decode_ctx): solve for k.
    fixed = pinned.isolated_request_s(p, d) - _decode_scaled_part(pinned, p, d)
    k = (target - fixed) / _decode_scaled_part(pinned, p, d)
    final = replace(pinned, base_s=pinned.base_s * k, decode_seq_s=pinned.decode_seq_s * k,
                    decode_ctx_s=pinned.decode_ctx_s * k)
    log(f"  step 4  scale base, decode_seq, decode_ctx by k = {k:.4f} so isolated_request_s({p},{d})"
        f" = {final.isolated_request_s(p, d):.3f} s (paper {target} s)")
    log(f"  result  {_fmt(final)}; rounded isolated = {rounded(final).isolated_request_s(p, d):.3f} s")
    return final


def _decode_scaled_part(m: LatencyModel, p: int, d: int) -> float:
    """Part of isolated_request_s that scales with (base, decode_seq, decode_ctx)."""
    only = LatencyModel(m.base_s, 0.0, 0.0, m.decode_seq_s, m.decode_ctx_s)
    return only.isolated_request_s(p, d)


def explain_grad2(v100: LatencyModel, log: Callable[[str], None] = print) -> None:
    """What the paper's grad2 could mean in the fitted model, with numbers for each reading."""
    p, d, target = PAPER_ISOLATED
    k = d - 1
    ctx_sum = k * (p + 1) + k * (k - 1) // 2
    mean_iter = (target - v100.prefill_s(p)) / k
    log(f"  grad2 = {PAPER_GRAD2_S:.1e}; fitted V100 decode_ctx_s = {v100.decode_ctx_s:.3e} s per context"
        f" token (grad2 is {PAPER_GRAD2_S / v100.decode_ctx_s:.0f}x it), decode_seq_s = {v100.decode_seq_s:.3e}")
    for ctx in (177, 1000, 2000):
        log(f"  slope of decode batch time per added sequence of context {ctx}: "
            f"{v100.decode_seq_s + v100.decode_ctx_s * ctx:.3e} s")
    log(f"  (the paper's 0.02 s decision interval, 'the minimum decode batch execution time', vs the fit's"
        f" one-sequence decode step at context 100: {v100.iteration_s(decode_seqs=1, decode_ctx_tokens=100):.4f} s)")
    decode_left = target - v100.prefill_s(p)
    log(f"  as a per-context-token slope, grad2 alone would give the 17 s request "
        f"{PAPER_GRAD2_S * ctx_sum:.1f} s of decode (+ {k} x base_s); the 17 s anchor leaves "
        f"{decode_left:.2f} s for its {k} decode steps ({mean_iter * 1e3:.2f} ms each)")
    per_seq = v100.decode_seq_s + v100.decode_ctx_s * 177
    log(f"  -> not consistent as a time slope: per context token it is {PAPER_GRAD2_S / v100.decode_ctx_s:.0f}x"
        f" the fit and {PAPER_GRAD2_S * ctx_sum / decode_left:.1f}x the anchor's decode time; per added"
        f" sequence (context 177, the Table 1 mean p + d/2) it is {PAPER_GRAD2_S / per_seq:.2f}x the fit."
        f" Read it as the paper's scale of r_d (|r_d| <= 1 up to {1 / PAPER_GRAD2_S:,.0f} tokens).")


def _fmt(m: LatencyModel) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in vars(m).items())


# ---------------------------------------------------------------------------------------------
# Entry point


@dataclass(frozen=True)
class Calibration:
    fits: dict[str, FitReport]
    derived: dict[str, LatencyModel]


def profile_path(dataset: str, data_dir: Path | str | None = None) -> Path:
    """A profile's file: under ``data_dir`` if given (as laid out there, not checked), else
    the registered dataset found and checked by ``llm_lb_gym.data.locate``."""
    from llm_lb_gym.data import get_dataset, locate

    if data_dir is None:
        return locate(dataset)
    return Path(data_dir) / get_dataset(dataset).path


def _setup(preset: str) -> tuple[str, AttentionTransfer]:
    """Which operator profile (a dataset name) and which attention transfer each preset uses."""
    if preset == "llama2-7b-a100":
        return ("vidur_a100_llama2_7b_mlp",
                AttentionTransfer(1.0, 1.0, 1.0, "Llama-2-7B A100 attention medians as profiled"))
    if preset == "llama3-8b-a100":
        return ("vidur_a100_llama3_8b_mlp", AttentionTransfer(
            1.0, 1.0, 8 / 32, "no Llama-3 attention medians: Llama-2-7B's, same 32 query heads x 128 "
            "(prefill FLOPs unchanged); decode KV-read part x 8/32 KV heads (GQA)"))
    bw, fl = bandwidth_ratio("a100", "h100"), flops_ratio("a100", "h100")
    return ("vidur_h100_llama2_7b_mlp", AttentionTransfer(
        fl, bw, 1.0, f"A100 attention: prefill x {fl:.3f} (FP16 tensor "
        f"{DATASHEETS['a100'].fp16_tensor_tflops}/{DATASHEETS['h100'].fp16_tensor_tflops} TFLOPS),"
        f" decode x {bw:.3f} ({DATASHEETS['a100'].memory_bandwidth_gb_s:.0f}/"
        f"{DATASHEETS['h100'].memory_bandwidth_gb_s:.0f} GB/s)"))


def calibrate(data_dir: Path | str | None = None, presets: Sequence[str] = FITTED_PRESETS + DERIVED_PRESETS,
              weighting: str = "relative", log: Callable[[str], None] = print) -> Calibration:
    """Fit each requested preset from the profiles (and derive V100 from the A100 fit); print all."""
    for name in presets:
        check_choice("preset", name, FITTED_PRESETS + DERIVED_PRESETS)
    check_choice("weighting", weighting, WEIGHTINGS)
    attention = load_attention_medians(profile_path("vidur_a100_llama2_7b_attention_medians", data_dir))
    cpu = load_cpu_overheads(profile_path("vidur_a100_cpu_overheads", data_dir))
    log(f"CPU overheads: {CPU_OVERHEAD_MODEL} TP1 (A100 host), sum of {', '.join(CPU_OVERHEAD_COLUMNS)};"
        f" {cpu.intercept_ms:.3f} + {cpu.slope_ms:.4f} x batch ms (used for batch < "
        f"{cpu.batch_sizes[0]:.0f}); the same table for every preset (only 7B TP1 is profiled).")
    a, b, c = decode_attention_fit(attention)
    log(f"decode attention per layer (Llama-2 A100) ~ {a:.4f} + {b:.5f} x batch + {c:.3e} x batch x context ms"
        " (absolute NNLS, so the KV term fits the large batches; only it is used: GQA scaling)")
    wanted = set(presets) | ({"llama2-7b-a100"} if "llama2-7b-v100" in presets else set())
    fits: dict[str, FitReport] = {}
    for name in (n for n in FITTED_PRESETS if n in wanted):
        dataset, transfer = _setup(name)
        path = profile_path(dataset, data_dir)
        ops = load_operator_profile(path)
        points = tuple(build_points(ops, attention, cpu, transfer))
        fits[name] = FitReport(name, fit_latency_model(points, weighting), points, weighting)
        _print_fit(fits[name], path, transfer, log)
        if name == "llama2-7b-h100":
            _check_h100_ratios(load_operator_profile(profile_path("vidur_a100_llama2_7b_mlp", data_dir)),
                               ops, log)
        other = "absolute" if weighting == "relative" else "relative"
        alt = FitReport(name, fit_latency_model(points, other), points, other)
        log(f"  ({other}-error NNLS for comparison: prefill mean/max {_pct(alt.summary('prefill'))},"
            f" decode mean/max {_pct(alt.summary('decode'))})")
    derived: dict[str, LatencyModel] = {}
    if "llama2-7b-v100" in presets:
        log("\n== llama2-7b-v100 (derived; no V100 profile exists) ==")
        derived["llama2-7b-v100"] = derive_v100(fits["llama2-7b-a100"].model, log)
        explain_grad2(derived["llama2-7b-v100"], log)
    log("\n== rounded presets (4 significant digits) ==")
    for name, model in [(n, f.model) for n, f in fits.items()] + list(derived.items()):
        log(f"  {name}: {_fmt(rounded(model))}")
    return Calibration(fits, derived)


def _check_h100_ratios(a100: OperatorProfile, h100: OperatorProfile, log: Callable[[str], None]) -> None:
    """The datasheet ratios used for H100 attention, against the profiled linear layers' ratios."""
    log(f"  check: profiled A100/H100 non-attention step time at 1 token {a100.step_ms(1) / h100.step_ms(1):.3f}"
        f" (bandwidth ratio {1 / bandwidth_ratio('a100', 'h100'):.3f}), at 4096 tokens "
        f"{a100.step_ms(4096) / h100.step_ms(4096):.3f} (FP16 ratio {1 / flops_ratio('a100', 'h100'):.3f})")


def _pct(pair: tuple[float, float]) -> str:
    return f"{pair[0] * 100:.1f}% / {pair[1] * 100:.1f}%"


def _print_fit(rep: FitReport, path: Path, transfer: AttentionTransfer, log: Callable[[str], None]) -> None:
    log(f"\n== {rep.preset} ==\n  operators: {path}\n  attention: {transfer.note}\n"
        f"  fit: {rep.weighting}-error NNLS -> {_fmt(rep.model)}")
    log(f"  {'point':<36}{'measured ms':>13}{'predicted ms':>14}{'rel err':>9}")
    for p in rep.points:
        pred = rep.predicted_s(p)
        log(f"  {p.label:<36}{p.measured_s * 1e3:>13.2f}{pred * 1e3:>14.2f}{pred / p.measured_s - 1:>+9.1%}")
    log(f"  prefill mean/max |rel err| {_pct(rep.summary('prefill'))}; "
        f"decode mean/max |rel err| {_pct(rep.summary('decode'))}")


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
