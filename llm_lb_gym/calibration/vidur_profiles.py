"""Step times of vLLM iterations rebuilt from Vidur's GPU profiles (the calibration's "measured").

Why: the simulator's latencies are only as good as its coefficients, and Vidur (microsoft/vidur,
MIT) profiled vLLM's kernels per operator. A batch's step time is Vidur's
``ExecutionTime.total_time``: ``layers x (sum of per-layer operator times) + CPU overheads``; we
keep the parts apart (GPU layers + attention, the embedding lookup Vidur leaves out, the CPU
overhead) so that a fit can be judged with and without the CPU side.

Public entry point for other fitting code (e.g. presets built from datasheets):
:func:`profile_step_times` ``(gpu, model, tp=1)`` -> the :class:`CalibrationPoint` list of one
(GPU, model), each with its batch composition and the three time components.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.optimize import nnls

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.sim.gpus import GPUS
from llm_lb_gym.sim.latency import causal_pairs

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
QUERY_HEADS = 32
"""Query heads of both profiled models (Llama-3-8B has 8 KV heads but 32 query heads)."""
SPLIT_KV_SEQ_HEADS = 512
"""vLLM's decode kernels split each sequence's KV across thread blocks (paged-attention v2)
while sequences x query heads <= 512: too few (sequence, head) blocks to fill the GPU otherwise."""
SMALL_BATCH_SEQS = SPLIT_KV_SEQ_HEADS // QUERY_HEADS
"""Decode batches up to this (16) run the split-KV kernel (``LatencyModel.small_batch_seqs``);
the A100 profile has batches 1 and 8 below it and 32 and 64 above."""


@dataclass(frozen=True)
class GPUThroughput:
    """Datasheet peaks used to transfer times between GPUs."""

    sku: str
    memory_bandwidth_gb_s: float
    fp16_tensor_tflops: float
    """Dense FP16 tensor-core peak (no sparsity)."""


def _throughput(gpu: str) -> GPUThroughput:
    """The library's datasheet (``llm_lb_gym.sim.gpus``, where the figures are set and cited) in
    the units this script prints."""
    g = GPUS[gpu]
    return GPUThroughput(g.name, g.memory_bandwidth_bytes_s / 1e9, g.fp16_flops / 1e12)


DATASHEETS: dict[str, GPUThroughput] = {
    # Vidur's a100 device is the 80 GB part (the llama2-7b-a100 preset's GPU).
    "a100": _throughput("a100-80gb"),
    "h100": _throughput("h100-80gb"),
    "v100": _throughput("v100-32gb"),
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
    """Per-layer sum of the non-attention operators' medians (ms) against num_tokens."""

    num_tokens: np.ndarray
    per_layer_ms: np.ndarray
    embedding_ms: np.ndarray
    kv_heads: int
    query_heads: int

    def layers_ms(self, num_tokens: float) -> float:
        """All layers' non-attention time, linearly interpolated in num_tokens."""
        return NUM_LAYERS * float(np.interp(num_tokens, self.num_tokens, self.per_layer_ms))

    def embedding_ms_at(self, num_tokens: float) -> float:
        """One embedding lookup (once per step)."""
        return float(np.interp(num_tokens, self.num_tokens, self.embedding_ms))

    def step_ms(self, num_tokens: float) -> float:
        """All layers' non-attention time plus one embedding lookup."""
        return self.layers_ms(num_tokens) + self.embedding_ms_at(num_tokens)


def load_operator_profile(path: Path, tp: int = 1) -> OperatorProfile:
    """Read Vidur's mlp.csv, keep the rows of tensor-parallel degree ``tp`` (per-GPU times of
    the sharded operators), average duplicate num_tokens rows."""
    sums: dict[int, list[tuple[float, float]]] = {}
    heads: set[tuple[int, int]] = set()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if int(row["num_tensor_parallel_workers"]) != tp:
                continue
            layer = sum(float(row[f"time_stats.{op}.median"]) for op in PER_LAYER_OPS)
            sums.setdefault(int(row["num_tokens"]), []).append(
                (layer, float(row["time_stats.emb.median"])))
            heads.add((int(row["n_head"]), int(row["n_kv_head"])))
    if not sums or len(heads) != 1:
        raise ValueError(f"{path}: expected TP{tp} rows of one model, got heads {sorted(heads)}")
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
# Step times at the profiled shapes


@dataclass(frozen=True)
class CalibrationPoint:
    """A batch composition and its step time rebuilt from the profiles, in parts (seconds)."""

    phase: str
    """'prefill' (one sequence's chunk) or 'decode' (a batch of equal-length sequences)."""
    label: str
    prefill_tokens: int
    prefill_attn_pairs: int
    """Causal pairs of the chunk (``latency.causal_pairs``)."""
    decode_seqs: int
    decode_ctx_tokens: int
    gpu_s: float
    """Layers x (non-attention operators + attention): Vidur's GPU time of the step."""
    embedding_s: float
    """The embedding lookup (Vidur leaves it out of the step; it runs once per step)."""
    cpu_s: float
    """Vidur's CPU overhead at this batch size."""

    @property
    def batched_tokens(self) -> int:
        """N of the latency model: prompt tokens computed + decode sequences."""
        return self.prefill_tokens + self.decode_seqs

    @property
    def n_seqs(self) -> int:
        """Sequences in the batch (one per prefill chunk or decode)."""
        return self.decode_seqs if self.phase == "decode" else 1

    def measured_s(self, with_cpu: bool) -> float:
        """Step time without CPU overhead and embedding (Vidur's GPU sum), or with both."""
        return self.gpu_s + (self.embedding_s + self.cpu_s if with_cpu else 0.0)


@dataclass(frozen=True)
class AttentionTransfer:
    """How Llama-2-7B-on-A100 attention medians become another (model, GPU, TP)'s."""

    prefill_factor: float
    decode_factor: float
    decode_kv_factor: float
    """Factor on the KV-read part only (GQA reads fewer KV heads; TP splits the heads)."""
    note: str


def decode_attention_fit(points: Sequence[AttentionPoint]) -> np.ndarray:
    """Non-negative (a, b, c, c_small) of per-layer decode attention (ms)
    ~ a + b*batch + (c + c_small [batch <= SMALL_BATCH_SEQS]) * batch * context.

    Only the KV-read terms (c, and the small batches' split-KV extra c_small: the same bytes read
    less efficiently) shrink with fewer KV heads; a and b are launch and per-sequence work that
    GQA does not change.
    """
    dec = [p for p in points if p.phase == "decode"]
    a = np.array([[1.0, p.query_tokens, p.query_tokens * p.context_tokens,
                   p.query_tokens * p.context_tokens * (p.query_tokens <= SMALL_BATCH_SEQS)] for p in dec])
    t = np.array([p.attention_ms for p in dec])
    scale = a.max(axis=0)
    coef, _ = nnls(a / scale, t)
    return coef / scale


def build_points(ops: OperatorProfile, attention: Sequence[AttentionPoint], cpu: CpuOverheads,
                 transfer: AttentionTransfer) -> list[CalibrationPoint]:
    """Step times at every profiled attention shape: prefill of one chunk, or a decode batch."""
    _, _, kv_c, kv_small = decode_attention_fit(attention)
    out = []
    for p in attention:
        if p.phase == "prefill":
            attn = (p.attention_ms + p.reshape_ms) * transfer.prefill_factor
            c, q = p.query_tokens, p.context_tokens
            out.append(CalibrationPoint(
                "prefill", f"prefill chunk={c} prefix={q}", c, causal_pairs(c, q), 0, 0,
                float(ops.layers_ms(c) + NUM_LAYERS * attn) / 1e3, ops.embedding_ms_at(c) / 1e3,
                cpu.at(1) / 1e3))
        else:
            b, L = p.query_tokens, p.context_tokens
            kv_part = (kv_c + (kv_small if b <= SMALL_BATCH_SEQS else 0.0)) * b * L
            attn = (p.attention_ms - kv_part * (1.0 - transfer.decode_kv_factor) + p.reshape_ms)
            if attn <= 0:
                raise ValueError(f"{p}: transferred decode attention {attn:.4f} ms is not positive")
            out.append(CalibrationPoint(
                "decode", f"decode batch={b} context={L}", 0, 0, b, b * L,
                float(ops.layers_ms(b) + NUM_LAYERS * attn * transfer.decode_factor) / 1e3,
                ops.embedding_ms_at(b) / 1e3, cpu.at(b) / 1e3))
    return out


# ---------------------------------------------------------------------------------------------
# Which profile each (GPU, model) uses


OPERATOR_DATASETS: dict[tuple[str, str], str] = {
    ("a100", "llama2-7b"): "vidur_a100_llama2_7b_mlp",
    ("a100", "llama3-8b"): "vidur_a100_llama3_8b_mlp",
    ("h100", "llama2-7b"): "vidur_h100_llama2_7b_mlp",
}
"""Registered operator profiles (``llm_lb_gym.data``) per (GPU, model)."""
TP_DEGREES = (1, 2, 4, 8)
"""Tensor-parallel degrees with operator rows in the profiles (attention medians are TP1)."""


def profile_path(dataset: str, data_dir: Path | str | None = None) -> Path:
    """A profile's file: under ``data_dir`` if given (as laid out there, not checked), else
    the registered dataset found and checked by ``llm_lb_gym.data.locate``."""
    from llm_lb_gym.data import get_dataset, locate

    if data_dir is None:
        return locate(dataset)
    return Path(data_dir) / get_dataset(dataset).path


def attention_transfer(gpu: str, model: str, tp: int = 1) -> AttentionTransfer:
    """How the Llama-2-7B A100 TP1 attention medians map to (gpu, model, tp).

    Llama-3-8B has the same 32 query heads of 128 (prefill FLOPs unchanged) and 8 KV heads
    (decode KV reads x 8/32). H100: prefill x the FP16 throughput ratio, decode x the bandwidth
    ratio. TP: each GPU holds 1/tp of the heads, so prefill and the KV-read part scale by 1/tp
    (the all-reduce after attention and MLP is not in these profiles).
    """
    kv = 8 / 32 if model == "llama3-8b" else 1.0
    notes = []
    if model == "llama3-8b":
        notes.append("no Llama-3 attention medians: Llama-2-7B's, same 32 query heads x 128 "
                     "(prefill FLOPs unchanged); decode KV-read part x 8/32 KV heads (GQA)")
    pre = dec = 1.0
    if gpu == "h100":
        pre, dec = flops_ratio("a100", "h100"), bandwidth_ratio("a100", "h100")
        notes.append(f"A100 attention: prefill x {pre:.3f} (FP16 tensor "
                     f"{DATASHEETS['a100'].fp16_tensor_tflops}/{DATASHEETS['h100'].fp16_tensor_tflops}"
                     f" TFLOPS), decode x {dec:.3f} ({DATASHEETS['a100'].memory_bandwidth_gb_s:.0f}/"
                     f"{DATASHEETS['h100'].memory_bandwidth_gb_s:.0f} GB/s)")
    if tp > 1:
        notes.append(f"TP{tp}: prefill attention and decode KV reads x 1/{tp} (heads split); "
                     "all-reduce not profiled here")
    if not notes:
        notes.append("Llama-2-7B A100 attention medians as profiled")
    return AttentionTransfer(pre / tp, dec, kv / tp, "; ".join(notes))


def profile_step_times(gpu: str, model: str, tp: int = 1,
                       data_dir: Path | str | None = None) -> list[CalibrationPoint]:
    """Profile-derived step times of (gpu, model, tp) at every profiled attention shape.

    ``gpu`` and ``model`` as Vidur names them (``a100``, ``llama2-7b``); the pairs with an
    operator profile are :data:`OPERATOR_DATASETS`. Raises ConfigError naming the allowed values
    otherwise, and ``llm_lb_gym.data.DataNotFoundError`` when the profiles are absent.
    """
    if (gpu, model) not in OPERATOR_DATASETS:
        allowed = ", ".join(f"{g}/{m}" for g, m in OPERATOR_DATASETS)
        raise ConfigError(f"profile (gpu, model)=({gpu!r}, {model!r}) is not profiled; allowed: {allowed}")
    if tp not in TP_DEGREES:
        raise ConfigError(f"tp={tp!r} is not profiled; allowed: {', '.join(map(str, TP_DEGREES))}")
    return build_points(*_load_profiles(gpu, model, tp, data_dir), attention_transfer(gpu, model, tp))


def _load_profiles(gpu: str, model: str, tp: int, data_dir: Path | str | None
                   ) -> tuple[OperatorProfile, list[AttentionPoint], CpuOverheads]:
    """The operator profile of (gpu, model, tp), the Llama-2 A100 attention medians, the CPU table."""
    return (load_operator_profile(profile_path(OPERATOR_DATASETS[gpu, model], data_dir), tp),
            load_attention_medians(profile_path("vidur_a100_llama2_7b_attention_medians", data_dir)),
            load_cpu_overheads(profile_path("vidur_a100_cpu_overheads", data_dir)))


DENSE_PREFILL_CHUNKS = tuple(range(128, 4097, 64))
"""Prompt sizes of the between-points check (:func:`dense_prefill_points`)."""


def dense_prefill_points(gpu: str, model: str, data_dir: Path | str | None = None,
                         chunks: Sequence[int] = DENSE_PREFILL_CHUNKS) -> list[CalibrationPoint]:
    """Whole-prompt prefills (no cached prefix) at every 64 tokens from 128 to 4,096: the linear
    layers as profiled at that size, attention interpolated linearly in the chunk size between
    the profiled no-prefix medians (128, 224, 512, 1,792, ..., 4,096).

    Why: the fit sees 22 prefill shapes; the linear layers are a staircase in N, so a fit can
    follow those shapes and miss the steps between them. These points are a check, not fit data
    (their attention is an interpolation, not a measurement)."""
    ops, attention, cpu = _load_profiles(gpu, model, 1, data_dir)
    factor = attention_transfer(gpu, model).prefill_factor
    rows = sorted((p.query_tokens, p.attention_ms + p.reshape_ms) for p in attention
                  if p.phase == "prefill" and p.context_tokens == 0)
    xs, ys = (np.array(v, dtype=float) for v in zip(*rows))
    return [CalibrationPoint("prefill", f"prefill chunk={c} prefix=0 (interpolated attention)", c,
                             causal_pairs(c), 0, 0,
                             float(ops.layers_ms(c) + NUM_LAYERS * np.interp(c, xs, ys) * factor) / 1e3,
                             ops.embedding_ms_at(c) / 1e3, cpu.at(1) / 1e3)
            for c in chunks]
