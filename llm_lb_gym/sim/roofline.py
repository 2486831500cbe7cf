"""Iteration-time coefficients of any (model, GPU, tensor-parallel degree) from first principles.

Why: profiles exist for two models on three GPUs (Vidur: A100, H100, A40); a router study wants
Llama-70B on 4 H100s or Mistral on an L4. Each kernel of a layer is either bound by memory
bandwidth or by tensor-core FLOPs; the achieved fraction of the datasheet peak is an efficiency
factor fitted once on the profiled GPUs (``python -m llm_lb_gym.experiments.calibrate_hardware``) and reused
for every other GPU. Per layer and GPU (weights, FLOPs, heads divided by the tensor-parallel
degree ``tp``):

- matrix multiplies (q/k/v, o, MLP): ``max(weight bytes / (BW e_w), 2 params N / (F e_f))``
  plus a launch each: a weight-read floor until the roofline knee, compute bound beyond it;
- element-wise kernels (2 RMSNorms, rotary, SiLU-and-mul, residual add, and the embedding once per
  step): activation bytes per token / (BW e_elem) plus a launch each;
- attention: prefill FLOPs per causal (query, key) pair / (F e_attn); decode KV bytes per context
  token / (BW e_kv) plus a per-sequence cost (``decode_seq_kv_tokens`` context tokens' worth);
  one launch per layer;
- LM head: its weight read once per step (logits only for each sequence's last token);
- tensor parallel: two all-reduces of the hidden states per layer (after attention and after the
  MLP), ring cost ``2 (tp-1)/tp x bytes / interconnect + latency`` (not profiled: see below);
- CPU overhead per step (schedule, sampler, prepare inputs, outputs): Vidur's A100-host table.

The result is the nine coefficients of the iteration-time contract (``latency.py``):
``t = base + token N + compute_token max(0, N - knee) + prefill_attn pairs + decode_seq B +
decode_ctx S + cpu_base + cpu_seq n_seqs``. Because every matrix multiply has the same
bytes-to-FLOPs ratio, the sum of their rooflines is one roofline with the knee
``knee_tokens = dtype_bytes F e_f / (2 BW e_w)`` (independent of the model). FP8 weights
(``architecture.quantization``) read 1 byte each and multiply at the FP8 peak where the GPU has
one (``gemm_peak_flops``): the knee stays where it is on Hopper and Ada (half the bytes, twice the
FLOPs) and halves on Ampere's weight-only kernels; the same efficiency factors apply (no FP8 run
is in the fit).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .._validate import check_range
from .architecture import ModelArchitecture
from .gpus import GPUDatasheet
from .latency import LatencyModel

GEMMS_PER_LAYER = 4
"""qkv projection, output projection, MLP up (gate+up fused), MLP down: vLLM's kernels."""
ELEMENTWISE_PER_LAYER = 5
"""input RMSNorm, rotary, post-attention RMSNorm, SiLU-and-mul, residual add (Vidur's op list)."""
ALLREDUCES_PER_LAYER = 2


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of datasheet peaks and fixed kernel costs (GPU-independent)."""

    weight_bandwidth: float
    """Fraction of peak memory bandwidth reached reading weights in the matrix multiplies."""
    linear_flops: float
    """Fraction of peak FP16 tensor FLOPs reached by compute-bound matrix multiplies."""
    gemm_launch_s: float
    """Fixed cost of one matrix-multiply kernel."""
    elementwise_bandwidth: float
    """Fraction of peak bandwidth reached by the element-wise kernels."""
    elementwise_launch_s: float
    attention_flops: float
    """Fraction of peak FLOPs reached by prefill attention (causal pairs only)."""
    kv_bandwidth: float
    """Fraction of peak bandwidth reached reading the KV cache in decode attention."""
    decode_seq_kv_tokens: float
    """Per-sequence cost of decode attention, in context tokens' worth of KV reads."""
    attention_launch_s: float

    def __post_init__(self) -> None:
        for f in fields(self):
            hi = 1.0 if f.name in ("weight_bandwidth", "linear_flops", "elementwise_bandwidth",
                                   "attention_flops", "kv_bandwidth") else None
            check_range(f"efficiency.{f.name}", getattr(self, f.name), 0.0, hi, lo_open=hi is not None)


# Printed by `python -m llm_lb_gym.experiments.calibrate_hardware` (fit on Vidur's A100, H100 and A40
# profiles of Llama-2-7B, tensor parallel 1/2/4/8; attention on the A100 TP1 medians).
CALIBRATED = Efficiency(
    weight_bandwidth=0.7965, linear_flops=0.6952, gemm_launch_s=4.722e-06,
    elementwise_bandwidth=0.7720, elementwise_launch_s=2.670e-06,
    attention_flops=0.2071, kv_bandwidth=0.8229, decode_seq_kv_tokens=16.95,
    attention_launch_s=1.517e-05,
)

# All-reduce: no profile exists. Bandwidth: NCCL's large-message bus bandwidth is ~200 of the
# 300 GB/s per direction on 8 x A100-80GB SXM (NVIDIA/nccl-tests#149); the same fraction of the
# datasheet interconnect is used on every GPU (PCIe GPUs included, unmeasured). Latency per call:
# fitted by `python -m llm_lb_gym.experiments.calibrate_hardware` to the published latencies of vLLM's
# custom all-reduce on 8 x H100 SXM (tp 2/4/8, 512 B to 1 MiB; sgl-project/sglang#2904).
ALLREDUCE_BANDWIDTH_EFFICIENCY = 200 / 300
ALLREDUCE_LATENCY_S = 1.068e-05

# CPU overhead per step, (intercept s, per-sequence s), by tensor-parallel degree: least-squares
# lines through Vidur's cpu_overheads_a100.csv (schedule + sampler + prepare inputs + process
# outputs medians + ray_comm_time mean), models pooled; printed by
# `python -m llm_lb_gym.experiments.calibrate_hardware`. TP8 was not profiled: TP4's line is used.
CPU_OVERHEAD_BY_TP: dict[int, tuple[float, float]] = {
    1: (9.678e-04, 4.869e-05),   # Llama-2-7B, phi-2
    2: (7.677e-03, 4.426e-05),   # CodeLlama-34B, InternLM-20B (Ray workers: ray_comm_time ~6 ms)
    4: (8.484e-03, 3.485e-05),   # Llama-2-70B, Qwen-72B
}


def cpu_overhead(tp: int) -> tuple[float, float]:
    """(cpu_base_s, cpu_seq_s) for a tensor-parallel degree (the largest profiled one below)."""
    return CPU_OVERHEAD_BY_TP[max(t for t in CPU_OVERHEAD_BY_TP if t <= tp)]


# ---------------------------------------------------------------------------------------------
# Per-layer costs (also what the calibration compares with the profiles)


def gemm_weight_bytes(arch: ModelArchitecture, tp: int) -> float:
    """Bytes of one layer's matrix-multiply weights on one GPU (1 per weight in FP8)."""
    return arch.linear_params_per_layer * arch.linear_weight_bytes / tp


def gemm_peak_flops(arch: ModelArchitecture, gpu: GPUDatasheet) -> float:
    """The tensor-core peak a layer's matrix multiplies run at: FP8 for FP8 weights on a GPU with
    FP8 tensor cores, else FP16 (weight-only FP8 kernels dequantize to FP16 before the multiply)."""
    if arch.quantization == "fp8" and gpu.fp8_flops > 0:
        return gpu.fp8_flops
    return gpu.fp16_flops


def elementwise_bytes_per_token(arch: ModelArchitecture, tp: int) -> float:
    """Activation bytes one token moves through a layer's element-wise kernels on one GPU.

    RMSNorms read and write the hidden state (2h each), the residual add reads two and writes one
    (3h): these are replicated on every rank. Rotary reads and writes q and k (sharded), SiLU-and-mul
    reads gate and up and writes one (3 I, sharded).
    """
    h = arch.hidden_size
    rope = 2 * (arch.q_size + arch.kv_heads_per_rank(tp) * tp * arch.head_dim) / tp
    act = 3 * arch.intermediate_size / tp if arch.gated_mlp else 2 * arch.intermediate_size / tp
    return arch.dtype_bytes * (2 * h + 2 * h + 3 * h + rope + act)


def gemm_layer_s(arch: ModelArchitecture, gpu: GPUDatasheet, tp: int, tokens: float,
                 eff: Efficiency = CALIBRATED) -> float:
    """One layer's matrix multiplies for ``tokens`` tokens on one GPU (the roofline)."""
    read = gemm_weight_bytes(arch, tp) / (gpu.memory_bandwidth_bytes_s * eff.weight_bandwidth)
    compute = 2 * arch.linear_params_per_layer / tp * tokens / (gemm_peak_flops(arch, gpu) * eff.linear_flops)
    return GEMMS_PER_LAYER * eff.gemm_launch_s + max(read, compute)


def elementwise_layer_s(arch: ModelArchitecture, gpu: GPUDatasheet, tp: int, tokens: float,
                        eff: Efficiency = CALIBRATED) -> float:
    """One layer's element-wise kernels for ``tokens`` tokens on one GPU."""
    return (ELEMENTWISE_PER_LAYER * eff.elementwise_launch_s + tokens * elementwise_bytes_per_token(arch, tp)
            / (gpu.memory_bandwidth_bytes_s * eff.elementwise_bandwidth))


def allreduce_s(gpu: GPUDatasheet, tp: int, message_bytes: float) -> float:
    """One ring all-reduce of ``message_bytes`` across ``tp`` GPUs (zero at tp 1)."""
    if tp == 1:
        return 0.0
    return ALLREDUCE_LATENCY_S + 2 * (tp - 1) / tp * message_bytes / (
        gpu.interconnect_bytes_s * ALLREDUCE_BANDWIDTH_EFFICIENCY)


# ---------------------------------------------------------------------------------------------
# The contract's coefficients

CONTRACT_FIELDS = ("base_s", "token_s", "compute_token_s", "knee_tokens", "prefill_attn_s",
                   "decode_seq_s", "decode_ctx_s", "cpu_base_s", "cpu_seq_s")


def derive_fields(arch: ModelArchitecture, gpu: GPUDatasheet, tp: int = 1, eff: Efficiency = CALIBRATED,
                  *, lm_head: bool = True, cpu: bool = True) -> dict[str, float]:
    """The nine iteration-time coefficients of ``arch`` on ``tp`` GPUs of kind ``gpu``.

    ``lm_head=False`` and ``cpu=False`` leave out what Vidur's operator profiles do not measure
    (the calibration compares like with like).
    """
    arch.check_tensor_parallel(tp)
    bw, flops, layers, db = gpu.memory_bandwidth_bytes_s, gpu.fp16_flops, arch.num_layers, arch.dtype_bytes
    weight_read = layers * gemm_weight_bytes(arch, tp) / (bw * eff.weight_bandwidth)
    compute_token = layers * 2 * arch.linear_params_per_layer / tp / (gemm_peak_flops(arch, gpu) * eff.linear_flops)
    launches = layers * (GEMMS_PER_LAYER * eff.gemm_launch_s + ELEMENTWISE_PER_LAYER * eff.elementwise_launch_s
                         + eff.attention_launch_s) + eff.elementwise_launch_s  # + embedding
    lm_head_read = (arch.vocab_size * arch.hidden_size * db / tp / (bw * eff.weight_bandwidth)) if lm_head else 0.0
    hidden_bytes = arch.hidden_size * db
    allreduce_latency = ALLREDUCES_PER_LAYER * layers * allreduce_s(gpu, tp, 0.0)
    allreduce_per_token = ALLREDUCES_PER_LAYER * layers * (allreduce_s(gpu, tp, hidden_bytes) - allreduce_s(gpu, tp, 0.0))
    elem_bw = bw * eff.elementwise_bandwidth
    kv_ctx = layers * 2 * arch.kv_heads_per_rank(tp) * arch.head_dim * db / (bw * eff.kv_bandwidth)
    cpu_base, cpu_seq = cpu_overhead(tp) if cpu else (0.0, 0.0)
    return {
        "base_s": launches + weight_read + lm_head_read + allreduce_latency,
        "token_s": (layers * elementwise_bytes_per_token(arch, tp) + 2 * hidden_bytes) / elem_bw
                   + allreduce_per_token,
        "compute_token_s": compute_token,
        "knee_tokens": weight_read / compute_token,
        "prefill_attn_s": arch.attention_flops_per_pair / tp / (flops * eff.attention_flops),
        "decode_seq_s": eff.decode_seq_kv_tokens * kv_ctx,
        "decode_ctx_s": kv_ctx,
        "cpu_base_s": cpu_base,
        "cpu_seq_s": cpu_seq,
    }


def contract_step_s(f: dict[str, float], tokens: int = 0, pairs: int = 0, decode_seqs: int = 0,
                    decode_ctx_tokens: int = 0, num_seqs: int | None = None) -> float:
    """One iteration under the contract's formula (``tokens`` = prompt tokens + decode sequences)."""
    n_seqs = decode_seqs if num_seqs is None else num_seqs
    return (f["base_s"] + f["token_s"] * tokens + f["compute_token_s"] * max(0.0, tokens - f["knee_tokens"])
            + f["prefill_attn_s"] * pairs + f["decode_seq_s"] * decode_seqs + f["decode_ctx_s"] * decode_ctx_tokens
            + f["cpu_base_s"] + f["cpu_seq_s"] * n_seqs)


def to_latency_model(f: dict[str, float]) -> LatencyModel:
    """The engine's latency model of a derived preset: the contract's nine fields, one to one."""
    return LatencyModel(**f)


# ---------------------------------------------------------------------------------------------
# Serving fit: per-GPU factors fitted to real end-to-end runs (issue 33, calibration/serving.py)


@dataclass(frozen=True)
class ServingScale:
    """Multipliers of :data:`CALIBRATED`'s efficiency factors on one GPU, fitted to real serving
    runs (``llm-lb-gym validate --fit``) rather than carried over from kernel profiles by
    datasheet ratios: the achieved fraction of a GPU's peak in a serving engine is not the
    profiled GPUs' (a 14B model's prefill-heavy runs take 1.8x as long on an A100 as on an H100,
    where the datasheets' ratio is 3.2x)."""

    linear_flops: float = 1.0
    """Multiplies ``linear_flops`` (compute-bound GEMMs; the knee moves with it)."""
    attention_flops: float = 1.0
    """Multiplies ``attention_flops`` (prefill attention; fitted on 32k-token prompts, where it
    dominates: the long-context term)."""
    bandwidth: float = 1.0
    """Multiplies the weight and element-wise bandwidth fractions (the decode step's floor)."""
    kv_bandwidth: float = 1.0
    """Multiplies the KV-read bandwidth fraction of decode attention. Apart from ``bandwidth``
    because the two reads are different kernels (paged attention gathering blocks vs dense
    GEMV weight streams) and the runs separate them: a KV-starved 32B model's decode steps are
    weight reads, a 14B model's with 64 long prompts in flight are mostly KV reads."""

    def __post_init__(self) -> None:
        for f in fields(self):
            check_range(f"serving_scale.{f.name}", getattr(self, f.name), 0.0, lo_open=True)


SERVING_SCALES: dict[str, ServingScale] = {}
"""Fitted per GPU (``calibration/serving.py`` prints them); filled at the end of this module."""
SERVING_CPU_S: tuple[float, float] = (0.0, 0.0)
"""(cpu_base_s, cpu_seq_s) of a serving engine's step that the GPU waits for (fitted)."""
SERVING_LAUNCH_SCALE: float = 1.0
"""Multiplies the per-kernel launch costs of :data:`CALIBRATED` (fitted): a V1 engine replays
its decode steps as CUDA graphs, where Vidur's profiles launched every kernel."""


def serving_scale(gpu: str) -> ServingScale:
    """The fitted scale of ``gpu``; 1 (the kernel profiles' factors, carried by datasheet
    ratios as before) for a GPU without serving runs in the fit. Why not the fitted GPUs' mean:
    their factors are each GPU's own (an A100's and an H100's achieved fractions differ by 2x);
    on the held-out L4 the mean gave a decode 43% too slow, the kernel factors 24%."""
    return SERVING_SCALES.get(gpu, ServingScale())


def serving_efficiency(scale: ServingScale, launch_scale: float | None = None) -> Efficiency:
    c = CALIBRATED
    ls = SERVING_LAUNCH_SCALE if launch_scale is None else launch_scale
    return Efficiency(
        weight_bandwidth=min(1.0, c.weight_bandwidth * scale.bandwidth), linear_flops=min(1.0, c.linear_flops * scale.linear_flops),
        gemm_launch_s=c.gemm_launch_s * ls, elementwise_bandwidth=min(1.0, c.elementwise_bandwidth * scale.bandwidth),
        elementwise_launch_s=c.elementwise_launch_s * ls, attention_flops=min(1.0, c.attention_flops * scale.attention_flops),
        kv_bandwidth=min(1.0, c.kv_bandwidth * scale.kv_bandwidth), decode_seq_kv_tokens=c.decode_seq_kv_tokens,
        attention_launch_s=c.attention_launch_s * ls)


def serving_fields(arch: ModelArchitecture, gpu: GPUDatasheet, tp: int = 1, scale: ServingScale | None = None,
                   cpu_s: tuple[float, float] | None = None, launch_scale: float | None = None) -> dict[str, float]:
    """The contract's coefficients under the serving fit: :func:`derive_fields` with ``gpu``'s
    serving scale, the launch scale and the serving engine's CPU step terms."""
    f = derive_fields(arch, gpu, tp, serving_efficiency(scale or serving_scale(gpu.name), launch_scale), cpu=False)
    f["cpu_base_s"], f["cpu_seq_s"] = cpu_s if cpu_s is not None else SERVING_CPU_S
    return f


# Printed by `llm-lb-gym validate --fit` (calibration/serving.py) on the corpus's fitted part:
# vLLM 0.11 (V1) serving Qwen3-14B on an A100 and an H100 (GPUStack performance lab), Qwen3-8B
# on an H100 at concurrency 1-8, and vLLM 0.19 serving Qwen3-0.6B on an H100 (kvcached's runs);
# docs/calibration.md has the errors, fitted and held out.
SERVING_SCALES.update({
    "a100-80gb": ServingScale(linear_flops=1.066, attention_flops=2.388, bandwidth=0.9839, kv_bandwidth=0.3551),
    "h100-80gb": ServingScale(linear_flops=0.566, attention_flops=1.699, bandwidth=1.105, kv_bandwidth=0.5415),
})
SERVING_CPU_S = (3.152e-05, 2.907e-05)
SERVING_LAUNCH_SCALE = 1.156
