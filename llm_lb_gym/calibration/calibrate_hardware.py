"""Fit the roofline efficiency factors on the profiled GPUs; print errors and the preset catalog.

Why: ``llm_lb_gym/sim/roofline.py`` builds presets for any (model, GPU, tensor-parallel degree)
from datasheet peaks times efficiency factors. This script fits those factors on Vidur's operator
profiles (Llama-2-7B on A100, H100, A40 at tensor parallel 1/2/4/8; attention medians on A100
TP1), reports how well the composed step time matches on each profiled GPU, how well a GPU left
out of the fit is predicted (leave-one-GPU-out: the expected error on unprofiled GPUs), how well
another model (Llama-3-8B on A100) is predicted, fits the unprofiled all-reduce to published
latencies, checks the memory model against vLLM's published KV-cache sizes, and prints every
shipped preset. The library holds the printed constants (``roofline.CALIBRATED`` and friends).

Run: ``python -m llm_lb_gym.experiments.calibrate_hardware [--data-dir DIR]``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import least_squares, nnls

from .vidur_profiles import CPU_OVERHEAD_COLUMNS, load_attention_medians, profile_path
from llm_lb_gym.sim import memory, roofline as rl
from llm_lb_gym.sim.architecture import ARCHITECTURES, ModelArchitecture
from llm_lb_gym.sim.gpus import GIB, GPUS, PROFILED_GPUS, GPUDatasheet
from llm_lb_gym.sim.latency import PRESETS

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
TOKEN_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
"""Batch sizes (tokens) at which the operator profiles are compared: log-spaced so that the
memory-bound and compute-bound regimes weigh alike."""
TP_DEGREES = (1, 2, 4, 8)
PROFILES = {("a100", "llama2-7b"): "vidur_a100_llama2_7b_mlp", ("h100", "llama2-7b"): "vidur_h100_llama2_7b_mlp",
            ("a40", "llama2-7b"): "vidur_a40_llama2_7b_mlp", ("a100", "llama3.1-8b"): "vidur_a100_llama3_8b_mlp"}
"""Vidur's operator profiles: (device, architecture) -> registered dataset. Meta-Llama-3-8B has
Llama-3.1-8B's shapes."""
TRAIN_GPUS = ("a100", "h100", "a40")

# Published latencies (ms) of vLLM's custom all-reduce on H100 SXM, tp 2/4/8, by message bytes
# (sgl-project/sglang#2904, "vllm" table): the only all-reduce measurement at hand.
ALLREDUCE_H100_MS = {
    512: (0.0095, 0.0091, 0.0101), 4096: (0.0088, 0.0085, 0.0093), 32768: (0.0087, 0.0092, 0.0118),
    262144: (0.0129, 0.0206, 0.0241), 524288: (0.0177, 0.0269, 0.0304), 1048576: (0.0266, 0.0402, 0.0450),
}
# vLLM's published KV-cache sizes, for the memory model.
VLLM_BLOCKS_LLAMA2_7B_A100 = 7351
"""Llama-2-7B, one A100-80GB, defaults (4,096-token budget, 256 sequences), vllm-project/vllm#2031."""
VLLM_KV_GIB_LLAMA3_8B = 53.29
"""Meta-Llama-3-8B, one 80 GB GPU reporting 79.22 GiB, defaults (8,192 tokens, 256 sequences):
available_kv_cache_memory in vllm-project/vllm#10511."""


@dataclass(frozen=True)
class OperatorSums:
    """Per-layer sums (ms) of one profile's operator medians at the token grid, per TP degree."""

    gemm_ms: dict[int, np.ndarray]
    elementwise_ms: dict[int, np.ndarray]
    embedding_ms: dict[int, np.ndarray]


def load_operator_sums(path: Path) -> OperatorSums:
    rows: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            med = lambda op: float(r[f"time_stats.{op}.median"])  # noqa: E731
            rows.setdefault((int(r["num_tensor_parallel_workers"]), int(r["num_tokens"])), []).append(
                (sum(map(med, GEMM_OPS)), sum(map(med, ELEMENTWISE_OPS)), med("emb")))
    out: dict[str, dict[int, np.ndarray]] = {"g": {}, "e": {}, "m": {}}
    for tp in TP_DEGREES:
        tokens = np.array(sorted(n for t, n in rows if t == tp), float)
        if not len(tokens):
            raise ValueError(f"{path}: no rows at tensor parallel {tp}")
        means = np.array([np.mean(rows[(tp, int(n))], axis=0) for n in tokens])
        for i, k in enumerate("gem"):
            out[k][tp] = np.interp(TOKEN_GRID, tokens, means[:, i])
    return OperatorSums(out["g"], out["e"], out["m"])


def _rel(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return pred / meas - 1.0


def _gemm_pred(arch, gpu, tp, eff) -> np.ndarray:
    return np.array([rl.gemm_layer_s(arch, gpu, tp, n, eff) for n in TOKEN_GRID]) * 1e3


def _elem_pred(arch, gpu, tp, eff) -> np.ndarray:
    return np.array([rl.elementwise_layer_s(arch, gpu, tp, n, eff) for n in TOKEN_GRID]) * 1e3


def fit_operators(data: dict[tuple[str, str], OperatorSums], keys: Sequence[tuple[str, str]],
                  start: rl.Efficiency = rl.CALIBRATED) -> rl.Efficiency:
    """Least squares on relative error (log-parameters keep them positive): matrix multiplies
    (weight bandwidth, linear FLOPs, launch) and element-wise kernels (bandwidth, launch)."""
    def with_gemm(x):
        return replace(start, weight_bandwidth=float(min(np.exp(x[0]), 1.0)),
                       linear_flops=float(min(np.exp(x[1]), 1.0)), gemm_launch_s=float(np.exp(x[2])))

    def gemm_res(x):
        eff = with_gemm(x)
        return np.concatenate([_rel(_gemm_pred(ARCHITECTURES[m], GPUS[PROFILED_GPUS[g]], tp, eff),
                                    data[(g, m)].gemm_ms[tp]) for g, m in keys for tp in TP_DEGREES])

    def with_elem(x, base):
        return replace(base, elementwise_bandwidth=float(min(np.exp(x[0]), 1.0)),
                       elementwise_launch_s=float(np.exp(x[1])))

    x0 = np.log([start.weight_bandwidth, start.linear_flops, start.gemm_launch_s])
    eff = with_gemm(least_squares(gemm_res, x0).x)

    def elem_res(x):
        e = with_elem(x, eff)
        return np.concatenate([_rel(_elem_pred(ARCHITECTURES[m], GPUS[PROFILED_GPUS[g]], tp, e),
                                    data[(g, m)].elementwise_ms[tp]) for g, m in keys for tp in TP_DEGREES])

    x0 = np.log([start.elementwise_bandwidth, start.elementwise_launch_s])
    return with_elem(least_squares(elem_res, x0).x, eff)


def fit_attention(points, arch: ModelArchitecture, gpu: GPUDatasheet, eff: rl.Efficiency) -> rl.Efficiency:
    """Non-negative least squares on relative error of per-layer attention (+ output reshape):
    prefill = a + k_p pairs, decode = a + k_seq B + k_ctx B ctx; then as efficiencies."""
    a, y = [], []
    for p in points:
        if p.phase == "prefill":
            c, q = p.query_tokens, p.context_tokens
            a.append([1.0, c * q + c * (c + 1) / 2, 0.0, 0.0])
        else:
            a.append([1.0, 0.0, p.query_tokens, p.query_tokens * p.context_tokens])
        y.append((p.attention_ms + p.reshape_ms) / 1e3)
    a, y = np.array(a), np.array(y)
    scale = a.max(axis=0)
    coef, _ = nnls(a / y[:, None] / scale, np.ones_like(y))
    launch, k_pair, k_seq, k_ctx = map(float, coef / scale)
    per_layer_pair_flops = arch.attention_flops_per_pair / arch.num_layers
    kv_layer_bytes = 2 * arch.num_kv_heads * arch.head_dim * arch.dtype_bytes
    return replace(eff, attention_flops=per_layer_pair_flops / (gpu.fp16_flops * k_pair),
                   kv_bandwidth=kv_layer_bytes / (gpu.memory_bandwidth_bytes_s * k_ctx),
                   decode_seq_kv_tokens=k_seq / k_ctx, attention_launch_s=launch)


def composed_errors(sums: OperatorSums, attention, arch, device: str, eff: rl.Efficiency) -> dict[str, np.ndarray]:
    """Relative errors of the composed GPU step time (all layers' operators + attention + embedding,
    no CPU, no LM head: what the profiles measure) at every profiled attention shape, TP1.

    Attention is measured on A100 only: on H100/A40 the A100 medians are scaled by the datasheet
    ratios (prefill by FLOPs, decode by bandwidth), so only their operator part is measured."""
    gpu, a100 = GPUS[PROFILED_GPUS[device]], GPUS["a100-80gb"]
    f = rl.derive_fields(arch, gpu, 1, eff, lm_head=False, cpu=False)
    ops_ms = lambda n: float(np.interp(n, TOKEN_GRID, sums.gemm_ms[1] + sums.elementwise_ms[1]))  # noqa: E731
    emb_ms = lambda n: float(np.interp(n, TOKEN_GRID, sums.embedding_ms[1]))  # noqa: E731
    out: dict[str, list[float]] = {"prefill": [], "decode": []}
    for p in attention:
        att = p.attention_ms + p.reshape_ms
        if p.phase == "prefill":
            c, q = p.query_tokens, p.context_tokens
            att *= a100.fp16_flops / gpu.fp16_flops
            pred = rl.contract_step_s(f, tokens=c, pairs=c * q + c * (c + 1) // 2)
        else:
            b, ctx = p.query_tokens, p.context_tokens
            c = b
            att *= a100.memory_bandwidth_bytes_s / gpu.memory_bandwidth_bytes_s
            pred = rl.contract_step_s(f, tokens=b, decode_seqs=b, decode_ctx_tokens=b * ctx)
        meas = (arch.num_layers * (ops_ms(c) + att) + emb_ms(c)) / 1e3
        out[p.phase].append(pred / meas - 1)
    return {k: np.array(v) for k, v in out.items()}


def operator_errors(sums: OperatorSums, arch, device: str, eff: rl.Efficiency, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """(linear layers, all non-attention operators) relative errors over the token grid."""
    gpu = GPUS[PROFILED_GPUS[device]]
    g, e = _gemm_pred(arch, gpu, tp, eff), _elem_pred(arch, gpu, tp, eff)
    return _rel(g, sums.gemm_ms[tp]), _rel(g + e, sums.gemm_ms[tp] + sums.elementwise_ms[tp])


def fit_allreduce(bandwidth_efficiency: float = rl.ALLREDUCE_BANDWIDTH_EFFICIENCY) -> tuple[float, float, np.ndarray]:
    """(latency s, median and max |rel err|) of the ring model on the H100 table, the bandwidth
    term fixed at NCCL's large-message efficiency (prefill messages are megabytes)."""
    bw = GPUS["h100-80gb"].interconnect_bytes_s * bandwidth_efficiency
    rows = [(b, tp, ms / 1e3) for b, t in ALLREDUCE_H100_MS.items() for tp, ms in zip((2, 4, 8), t)]

    def res(x):
        return np.array([(np.exp(x[0]) + 2 * (tp - 1) / tp * b / bw) / s - 1 for b, tp, s in rows])

    sol = least_squares(res, np.log([1e-5]))
    return float(np.exp(sol.x[0])), float(np.median(np.abs(res(sol.x)))), float(np.abs(res(sol.x)).max())


def fit_cpu_overheads(path: Path) -> dict[int, tuple[float, float, list[str]]]:
    """Per TP degree: least-squares line (s, s per sequence) through every model's rows."""
    by_tp: dict[int, list[tuple[float, float]]] = {}
    models: dict[int, set[str]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            tp = int(r["tensor_parallel_degree"])
            by_tp.setdefault(tp, []).append((float(r["batch_size"]),
                                             sum(float(r[c] or 0.0) for c in CPU_OVERHEAD_COLUMNS) / 1e3))
            models.setdefault(tp, set()).add(r["model_name"])
    out = {}
    for tp, pts in sorted(by_tp.items()):
        x, y = np.array(pts).T
        slope, intercept = np.polyfit(x, y, 1)
        out[tp] = (float(intercept), float(slope), sorted(models[tp]))
    return out


def _mm(e: np.ndarray) -> str:
    e = np.abs(e)
    return f"{np.median(e) * 100:5.1f}% / {e.max() * 100:5.1f}%"


def _sig(x: float) -> str:
    return f"{x:.4g}"


@dataclass(frozen=True)
class HardwareCalibration:
    efficiency: rl.Efficiency
    loo: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]]
    """held-out device -> tp -> (linear-layer errors, non-attention errors)."""
    composed: dict[str, dict[str, np.ndarray]]
    allreduce: tuple[float, float, float]
    """(latency s, median and max |rel err| over the published table)."""
    cpu: dict[int, tuple[float, float, list[str]]]
    non_torch_bytes: float


def calibrate_hardware(data_dir: Path | str | None = None, log: Callable[[str], None] = print,
                       table: bool = True) -> HardwareCalibration:
    data = {k: load_operator_sums(profile_path(d, data_dir)) for k, d in PROFILES.items()}
    attention = load_attention_medians(profile_path("vidur_a100_llama2_7b_attention_medians", data_dir))
    train = [(g, "llama2-7b") for g in TRAIN_GPUS]
    eff = fit_operators(data, train)
    eff = fit_attention(attention, ARCHITECTURES["llama2-7b"], GPUS["a100-80gb"], eff)
    log("== Efficiency factors (fit on Llama-2-7B, A100/H100/A40, tp 1/2/4/8, tokens "
        f"{TOKEN_GRID[0]}-{TOKEN_GRID[-1]}; attention on A100 TP1 medians) ==")
    for f in fields(eff):
        log(f"  {f.name:<24}{_sig(getattr(eff, f.name))}")
    log(f"  -> roofline knee on each GPU (tokens): "
        + ", ".join(f"{n} {rl.derive_fields(ARCHITECTURES['llama2-7b'], g, 1, eff)['knee_tokens']:.0f}"
                    for n, g in GPUS.items()))

    log("\n== Fit error on the profiled GPUs (median / max |relative error|) ==")
    log(f"  {'GPU':<6}{'tp':>3}  {'linear layers':>17}  {'non-attention ops':>17}")
    for g in TRAIN_GPUS:
        for tp in TP_DEGREES:
            lin, ops = operator_errors(data[(g, "llama2-7b")], ARCHITECTURES["llama2-7b"], g, eff, tp)
            log(f"  {g:<6}{tp:>3}  {_mm(lin):>17}  {_mm(ops):>17}")
    composed = {}
    log("  composed GPU step time, TP1 (22 prefill shapes chunk 128-4,096; 10 decode shapes batch 1-64 x "
        "context 512-2,048):")
    for g in TRAIN_GPUS:
        composed[g] = composed_errors(data[(g, "llama2-7b")], attention, ARCHITECTURES["llama2-7b"], g, eff)
        note = "" if g == "a100" else "  (attention scaled from A100 by datasheet ratios)"
        log(f"  {g:<6} prefill {_mm(composed[g]['prefill'])}   decode {_mm(composed[g]['decode'])}{note}")

    log("\n== Leave one GPU out: fit the operators on the other two, predict the third ==")
    log(f"  {'held out':<9}{'tp':>3}  {'linear layers':>17}  {'non-attention ops':>17}")
    loo: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = {}
    for held in TRAIN_GPUS:
        e = fit_operators(data, [(g, "llama2-7b") for g in TRAIN_GPUS if g != held])
        loo[held] = {}
        for tp in TP_DEGREES:
            loo[held][tp] = operator_errors(data[(held, "llama2-7b")], ARCHITECTURES["llama2-7b"], held, e, tp)
            log(f"  {held:<9}{tp:>3}  {_mm(loo[held][tp][0]):>17}  {_mm(loo[held][tp][1]):>17}")
        log(f"  {'':<9}    fitted: weight_bandwidth {e.weight_bandwidth:.3f}, linear_flops {e.linear_flops:.3f}, "
            f"elementwise_bandwidth {e.elementwise_bandwidth:.3f}")
    log("  another model: Llama-3-8B on A100 (not in the fit)")
    for tp in TP_DEGREES:
        lin, ops = operator_errors(data[("a100", "llama3.1-8b")], ARCHITECTURES["llama3.1-8b"], "a100", eff, tp)
        log(f"  {'a100 L3':<9}{tp:>3}  {_mm(lin):>17}  {_mm(ops):>17}")

    lat, ar_med, ar_max = fit_allreduce()
    log("\n== All-reduce (NOT profiled here) ==")
    log(f"  bandwidth: {rl.ALLREDUCE_BANDWIDTH_EFFICIENCY:.4g} of the datasheet per-direction interconnect "
        "(NCCL large-message bus bandwidth ~200 of 300 GB/s on 8 x A100 SXM, NVIDIA/nccl-tests#149)")
    log(f"  latency {lat:.4g} s per call: least squares on vLLM's custom all-reduce latencies on H100 "
        f"(sgl-project/sglang#2904, tp 2/4/8, 512 B-1 MiB); median / max |rel err| over that table "
        f"{ar_med * 100:.1f}% / {ar_max * 100:.1f}% (mid-size messages are slower than the ring model)")

    cpu = fit_cpu_overheads(profile_path("vidur_a100_cpu_overheads", data_dir))
    log("\n== CPU overhead per step (Vidur cpu_overheads_a100.csv; intercept s + per-sequence s) ==")
    for tp, (b, s, models) in cpu.items():
        log(f"  tp{tp}: {b:.4g} + {s:.4g} x seqs   ({', '.join(models)})")

    log("\n== Memory model against vLLM's published KV-cache sizes ==")
    l2, l3 = ARCHITECTURES["llama2-7b"], ARCHITECTURES["llama3.1-8b"]
    a100 = GPUS["a100-80gb"]
    act = memory.activation_peak_bytes(l2, 1, 4096, 256)
    kv_block = memory.kv_bytes_per_token_per_gpu(l2, 1) * 16
    non_torch = a100.memory_bytes * 0.9 - l2.weight_bytes - act - VLLM_BLOCKS_LLAMA2_7B_A100 * kv_block
    log(f"  Llama-2-7B, A100-80GB: weights {l2.weight_bytes / GIB:.2f} GiB, activation estimate "
        f"{act / GIB:.3f} GiB; vLLM's {VLLM_BLOCKS_LLAMA2_7B_A100} blocks leave {non_torch / GIB:.3f} GiB "
        f"non-torch (library: {memory.NON_TORCH_BYTES / GIB:.3f} GiB)")
    blocks = memory.num_kv_blocks(l2, a100, 1, block_size=16, gpu_memory_utilization=0.9,
                                  max_num_batched_tokens=4096, max_num_seqs=256)
    log(f"  -> model: {blocks} blocks (vLLM {VLLM_BLOCKS_LLAMA2_7B_A100})")
    h100 = GPUS["h100-80gb"]
    blocks3 = memory.num_kv_blocks(l3, h100, 1, block_size=16, gpu_memory_utilization=0.9,
                                   max_num_batched_tokens=8192, max_num_seqs=256)
    kv3 = blocks3 * memory.kv_bytes_per_token_per_gpu(l3, 1) * 16 / GIB
    log(f"  Llama-3-8B, 79.22 GiB GPU: model KV {kv3:.2f} GiB vs vLLM {VLLM_KV_GIB_LLAMA3_8B} GiB "
        f"({kv3 / VLLM_KV_GIB_LLAMA3_8B - 1:+.1%}); activation estimate "
        f"{memory.activation_peak_bytes(l3, 1, 8192, 256) / GIB:.2f} GiB (vLLM measured 1.26 GiB)")
    cal = HardwareCalibration(eff, loo, composed, (lat, ar_med, ar_max), cpu, non_torch)
    if table:
        print_preset_table(log)
    return cal


def print_preset_table(log: Callable[[str], None] = print) -> None:
    """Every catalog preset: KV blocks at the defaults, decode step (B=1, context 1,024) and a
    1,024-token prefill under the contract formula (CPU overhead included)."""
    log("\n== Shipped presets (defaults: utilization 0.9, block 16, 128 sequences, token budget "
        "max(context, 2048); CPU overhead included) ==")
    log(f"  {'preset':<30}{'KV blocks':>10}{'decode B=1 ctx1k ms':>21}{'prefill 1k ms':>15}")
    for name in sorted(PRESETS):
        p = PRESETS[name]
        blocks = p.num_kv_blocks(16, 0.9, max(p.model_spec.max_model_len, 2048), 128)
        f = getattr(p, "contract_fields", None) or {}
        if f:
            dec = rl.contract_step_s(f, tokens=1, decode_seqs=1, decode_ctx_tokens=1024)
            pre = rl.contract_step_s(f, tokens=1024, pairs=1024 * 1025 // 2, num_seqs=1)
        else:   # hand-set presets: their own LatencyModel
            dec = p.latency.iteration_s(0, 0, 1, 1024)
            pre = p.latency.prefill_s(1024)
        log(f"  {name:<30}{blocks:>10}{dec * 1e3:>21.2f}{pre * 1e3:>15.1f}")
