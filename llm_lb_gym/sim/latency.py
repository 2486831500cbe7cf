"""Iteration-time model of one inference instance, and hardware/model presets.

An iteration (one forward pass of the batch) costs

    t = base_s
        + prefill_token_s * (prompt tokens computed in this iteration)
        + prefill_attn_s  * sum over prefill chunks of chunk * (cached prefix + chunk)
        + decode_seq_s    * (decode sequences in the batch)
        + decode_ctx_s    * (sum of the decode sequences' context lengths)

Why this shape: linear layers are compute bound in prefill (cost per token), prefill attention is
quadratic in the prompt, a decode step is memory bound (weights read once per step: ``base_s``;
KV read per context token: ``decode_ctx_s``) with a small per-sequence cost. It is linear in the
decode batch's context sum, which lets the engine advance stretches of identical decode
iterations in closed form (see ``engine.py``).

Presets: coefficients per (model, GPU). Their source and fit error are printed by
``python -m experiments.calibrate`` and documented in the README.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validate import ConfigError, check_range, lookup


@dataclass(frozen=True)
class LatencyModel:
    """Coefficients of the iteration-time model, all in seconds."""

    base_s: float
    """Constant per iteration (> 0): weight reads, kernel launches, CPU scheduling overhead."""
    prefill_token_s: float
    """Per prompt token computed in the iteration (the paper's grad1 on V100: 3.2e-4)."""
    prefill_attn_s: float
    """Per (query token x key token) pair of prefill attention: chunk * (prefix + chunk)."""
    decode_seq_s: float
    """Per decode sequence in the batch."""
    decode_ctx_s: float
    """Per context token of the decode sequences (KV cache reads)."""

    def __post_init__(self) -> None:
        # A positive base keeps every iteration (and a request's ideal latency) longer than 0.
        check_range("latency.base_s", self.base_s, 0.0, lo_open=True)
        for name in ("prefill_token_s", "prefill_attn_s", "decode_seq_s", "decode_ctx_s"):
            check_range(f"latency.{name}", getattr(self, name), 0.0)

    def iteration_s(self, prefill_tokens: int = 0, prefill_attn_pairs: int = 0,
                    decode_seqs: int = 0, decode_ctx_tokens: int = 0) -> float:
        """Duration of one iteration with the given batch composition."""
        return (self.base_s + self.prefill_token_s * prefill_tokens
                + self.prefill_attn_s * prefill_attn_pairs
                + self.decode_seq_s * decode_seqs + self.decode_ctx_s * decode_ctx_tokens)

    def prefill_s(self, prompt_tokens: int) -> float:
        """A prefill-only iteration of one prompt."""
        return self.iteration_s(prompt_tokens, prompt_tokens * prompt_tokens)

    def isolated_request_s(self, prompt_tokens: int, decode_tokens: int) -> float:
        """Latency of one request alone on an idle instance (prefill, then decode steps).

        The first token comes from the prefill; each of the remaining ``decode_tokens - 1``
        tokens takes one decode iteration whose context is the prompt plus tokens so far.
        """
        k = max(int(decode_tokens) - 1, 0)
        ctx_sum = k * (prompt_tokens + 1) + k * (k - 1) // 2
        decode = k * (self.base_s + self.decode_seq_s) + self.decode_ctx_s * ctx_sum
        return self.prefill_s(prompt_tokens) + decode


@dataclass(frozen=True)
class ModelSpec:
    """What the KV-cache sizing needs to know of a model."""

    name: str
    weight_bytes: float
    """Bytes of the weights in fp16 (2 x parameters)."""
    kv_bytes_per_token: int
    """2 (K and V) x layers x KV heads x head dim x 2 bytes."""
    max_model_len: int
    """Context window (prompt + output tokens) of the model."""


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: float
    activation_reserve_bytes: float
    """Memory vLLM's profiling run keeps for activations and the CUDA graph pool."""


GIB = 1024 ** 3

MODELS: dict[str, ModelSpec] = {
    # Llama-2-7B: 6.74e9 parameters, 32 layers, 32 KV heads of 128 -> 2*32*32*128*2 = 524,288 B.
    "llama2-7b": ModelSpec("llama2-7b", 2 * 6.74e9, 2 * 32 * 32 * 128 * 2, 4096),
    # Llama-3(.1)-8B: 8.03e9 parameters, 32 layers, GQA with 8 KV heads of 128 -> 131,072 B.
    # max_model_len 8192: the common serving setting (the model allows 128k).
    "llama3-8b": ModelSpec("llama3-8b", 2 * 8.03e9, 2 * 32 * 8 * 128 * 2, 8192),
}

GPUS: dict[str, GPUSpec] = {
    "v100": GPUSpec("v100", 32 * GIB, 1.5 * GIB),
    "a100": GPUSpec("a100", 80 * GIB, 2.0 * GIB),
    "h100": GPUSpec("h100", 80 * GIB, 2.0 * GIB),
}


@dataclass(frozen=True)
class HardwarePreset:
    """A (model, GPU) pair with its latency coefficients and where they come from."""

    name: str
    model: str
    gpu: str
    latency: LatencyModel
    source: str

    @property
    def model_spec(self) -> ModelSpec:
        return lookup("model", MODELS, self.model)

    @property
    def gpu_spec(self) -> GPUSpec:
        return lookup("gpu", GPUS, self.gpu)

    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float,
                      max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None) -> int:
        """KV blocks left after weights and activations, as vLLM's profiling run derives them.

        These hand-set presets keep a fixed activation reserve and ignore the batch limits; the
        catalog presets (``catalog.py``) estimate the activation peak from them."""
        m, g = self.model_spec, self.gpu_spec
        free = g.memory_bytes * gpu_memory_utilization - m.weight_bytes - g.activation_reserve_bytes
        blocks = int(free // (m.kv_bytes_per_token * block_size))
        if blocks < 1:
            raise ValueError(
                f"preset {self.name}: no memory left for the KV cache at "
                f"gpu_memory_utilization={gpu_memory_utilization}"
            )
        return blocks


# Coefficients: experiments/calibrate.py prints the fit; docs/calibration.md has sources and errors.
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
_FIT = "non-negative least squares on relative error, experiments/calibrate.py; docs/calibration.md"

register_preset(HardwarePreset(
    "llama2-7b-v100", "llama2-7b", "v100",
    LatencyModel(base_s=0.01577, prefill_token_s=3.2e-4, prefill_attn_s=2.127e-8,
                 decode_seq_s=1.448e-4, decode_ctx_s=4.986e-7),
    source=("derived, no V100 profile exists: llama2-7b-a100 fit x A100/V100 ratios (memory-bound "
            "terms 2039/900 GB/s, compute-bound 312/125 TFLOPS), prefill_token_s pinned to the "
            "paper's grad1 3.2e-4, decode terms scaled so isolated_request_s(1000, 1000) = 17 s "
            "(paper, arXiv 2408.13510); experiments/calibrate.py, docs/calibration.md"),
))
register_preset(HardwarePreset(
    "llama2-7b-a100", "llama2-7b", "a100",
    LatencyModel(base_s=0.009675, prefill_token_s=4.838e-5, prefill_attn_s=8.522e-9,
                 decode_seq_s=8.888e-5, decode_ctx_s=3.06e-7),
    source=f"{_VIDUR}: a100 Llama-2-7b-hf mlp.csv, attention medians, CPU overheads; {_FIT}",
))
register_preset(HardwarePreset(
    "llama3-8b-a100", "llama3-8b", "a100",
    LatencyModel(base_s=0.01054, prefill_token_s=4.952e-5, prefill_attn_s=9.386e-9,
                 decode_seq_s=1.03e-4, decode_ctx_s=8.134e-8),
    source=(f"{_VIDUR}: a100 Meta-Llama-3-8B mlp.csv; attention from Llama-2-7B's A100 medians "
            f"(decode KV-read part x 8/32 KV heads); Llama-2-7B CPU overheads; {_FIT}"),
))
register_preset(HardwarePreset(
    "llama2-7b-h100", "llama2-7b", "h100",
    LatencyModel(base_s=0.006285, prefill_token_s=1.494e-5, prefill_attn_s=2.489e-9,
                 decode_seq_s=7.231e-5, decode_ctx_s=1.857e-7),
    source=(f"{_VIDUR}: h100 Llama-2-7b-hf mlp.csv; attention from A100 medians (prefill x 312/989.4 "
            f"TFLOPS, decode x 2039/3352 GB/s); A100-host CPU overheads; {_FIT}"),
))


def ideal_latency_s(latency: LatencyModel, prompt_tokens: np.ndarray, pred_decode_tokens: np.ndarray) -> np.ndarray:
    """Vectorised ``LatencyModel.isolated_request_s`` with real-valued predicted decode tokens: the
    ideal latency T_j of the env's reward and the order of the "shortest" candidates."""
    p = np.asarray(prompt_tokens, np.float64)
    k = np.maximum(np.asarray(pred_decode_tokens, np.float64) - 1.0, 0.0)
    prefill = latency.base_s + latency.prefill_token_s * p + latency.prefill_attn_s * p * p
    decode = k * (latency.base_s + latency.decode_seq_s) + latency.decode_ctx_s * (k * (p + 1) + k * (k - 1) / 2)
    return prefill + decode
