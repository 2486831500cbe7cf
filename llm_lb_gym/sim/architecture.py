"""Transformer architecture of a served model: what its weights, KV cache and FLOPs cost.

Why: a latency preset for any (model, GPU, tensor-parallel degree) is built from first principles
(``roofline.py``) and the KV-cache size from memory as vLLM computes it (``memory.py``); both need
the model's shapes only. They come from a Hugging Face ``config.json`` (:func:`from_hf_config`) or
from the registry of shipped architectures below, whose numbers are the public config.json
values of each model (checked against the published parameter counts in
``tests/test_hardware_presets.py``).

Decoder-only, Llama-style: RMSNorm, rotary embeddings, grouped-query attention, (gated) MLP.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .._validate import ConfigError, check_bool, check_choice, check_int, lookup

QUANTIZATIONS = {"fp8": 1}
"""Weight quantizations the roofline prices (name -> bytes per linear weight): vLLM's ``fp8``
(``--quantization fp8``, or a checkpoint whose ``quantization_config.quant_method`` is fp8)."""


@dataclass(frozen=True)
class ModelArchitecture:
    """Shapes of a decoder-only transformer (one Hugging Face ``config.json``)."""

    name: str
    num_layers: int
    """Decoder layers (``num_hidden_layers``)."""
    hidden_size: int
    num_heads: int
    """Query heads (``num_attention_heads``)."""
    num_kv_heads: int
    """Key/value heads (``num_key_value_heads``; = num_heads without grouped-query attention)."""
    head_dim: int
    intermediate_size: int
    """MLP width."""
    vocab_size: int
    max_model_len: int
    """Context window (``max_position_embeddings``)."""
    gated_mlp: bool = True
    """SwiGLU-style MLP with gate and up projections (3 matrices) instead of 2."""
    tied_embeddings: bool = False
    """The LM head shares the embedding matrix (``tie_word_embeddings``)."""
    qkv_bias: bool = False
    """Bias on the q, k, v projections (Qwen2)."""
    dtype_bytes: int = 2
    """Bytes per weight and KV element (fp16/bf16)."""
    quantization: str | None = None
    """``fp8``: the layers' matrix-multiply weights in FP8 (1 byte; vLLM's ``--quantization fp8``
    or a checkpoint's ``quantization_config``), their GEMMs at the GPU's FP8 rate where it has
    FP8 tensor cores (``gpus.GPUDatasheet.fp8_flops``; activations quantized per token) and at
    the FP16 rate through weight-only kernels where not; the embedding, LM head, norms, attention
    and KV cache stay in ``dtype_bytes``, as vLLM keeps them. None: every weight in dtype_bytes."""

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size", "max_model_len", "dtype_bytes"):
            check_int(f"architecture.{f}", getattr(self, f), 1)
        for f in ("gated_mlp", "tied_embeddings", "qkv_bias"):
            check_bool(f"architecture.{f}", getattr(self, f))
        if self.quantization is not None:
            check_choice("architecture.quantization", self.quantization, QUANTIZATIONS)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"architecture {self.name}: num_heads={self.num_heads} must be a multiple of "
                              f"num_kv_heads={self.num_kv_heads} (grouped-query attention)")

    # --- parameters and bytes -------------------------------------------------------------

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the layer's matrix multiplies: q, k, v, o projections and the MLP."""
        h = self.hidden_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate_size
        return attn + mlp

    @property
    def params_per_layer(self) -> int:
        """Linear weights plus the two RMSNorm scales and any q/k/v biases."""
        bias = self.q_size + 2 * self.kv_size if self.qkv_bias else 0
        return self.linear_params_per_layer + 2 * self.hidden_size + bias

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Zero when tied to the embedding (the same matrix is read)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters: embedding, layers, final norm, LM head."""
        return (self.embedding_params + self.num_layers * self.params_per_layer + self.hidden_size
                + self.lm_head_params)

    @property
    def linear_weight_bytes(self) -> int:
        """Bytes per matrix-multiply weight of a layer (``quantization``)."""
        return QUANTIZATIONS[self.quantization] if self.quantization else self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        linear = self.num_layers * self.linear_params_per_layer
        return linear * self.linear_weight_bytes + (self.num_params - linear) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token (whole model, before tensor-parallel sharding)."""
        return 2 * self.num_layers * self.kv_size * self.dtype_bytes

    # --- FLOPs -------------------------------------------------------------------------

    @property
    def linear_flops_per_token(self) -> int:
        """Multiply-adds x 2 of all layers' matrix multiplies for one token (LM head excluded:
        vLLM computes logits only for each sequence's last token)."""
        return 2 * self.num_layers * self.linear_params_per_layer

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query, key) pair over all layers: q.k and p.v, 2 x head_dim each, per
        query head."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    def check_tensor_parallel(self, tp: int) -> None:
        """vLLM's sharding rule: heads split evenly; KV heads split or replicated."""
        check_int("tensor_parallel", tp, 1, 64)
        if self.num_heads % tp or (self.num_kv_heads % tp and tp % self.num_kv_heads):
            raise ConfigError(
                f"tensor_parallel={tp} does not divide {self.name}'s {self.num_heads} attention heads "
                f"and {self.num_kv_heads} KV heads (vLLM requires num_heads % tp == 0 and KV heads split "
                f"or replicated); allowed: "
                + ", ".join(str(t) for t in (1, 2, 4, 8, 16) if not self.num_heads % t
                            and (not self.num_kv_heads % t or not t % self.num_kv_heads)))

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads each GPU holds: split when tp divides them, else one replicated head."""
        return max(1, self.num_kv_heads // tp)


# ---------------------------------------------------------------------------------------------
# Hugging Face config.json

_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
             "max_position_embeddings")
_OPTIONAL_INTS = ("num_key_value_heads", "head_dim")
_OPTIONAL_BOOLS = ("tie_word_embeddings", "attention_bias")
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 2}


def from_hf_config(source: str | Path | Mapping[str, Any], name: str | None = None) -> ModelArchitecture:
    """Architecture from a Hugging Face ``config.json`` (a path, its folder, or the parsed dict).

    Errors name the file and the missing or bad key. Weights and KV cache are 2 bytes for every
    ``torch_dtype``: vLLM's ``dtype="auto"`` serves float32 checkpoints in float16.
    """
    where = "config dict"
    if isinstance(source, Mapping):
        cfg = dict(source)
    else:
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        where = str(path)
        try:
            cfg = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"model config {where}: file not found") from None
        except json.JSONDecodeError as err:
            raise ConfigError(f"model config {where}: not valid JSON ({err})") from None
        if not isinstance(cfg, dict):
            raise ConfigError(f"model config {where}: expected a JSON object")
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise ConfigError(f"model config {where}: missing key(s) {', '.join(missing)} "
                          f"(required: {', '.join(_REQUIRED)})")
    # Every value the shapes are computed from, checked where it is read (a 0 or a string would
    # raise ZeroDivisionError or TypeError below without naming the file or the key).
    try:
        for key in _REQUIRED + _OPTIONAL_INTS:
            if key in _REQUIRED or cfg.get(key) is not None:
                check_int(key, cfg[key], 1)
        for key in _OPTIONAL_BOOLS:
            if cfg.get(key) is not None:
                check_bool(key, cfg[key])
    except ConfigError as err:
        raise ConfigError(f"model config {where}: {err}") from None
    heads = cfg["num_attention_heads"]
    dtype = cfg.get("torch_dtype") or "float16"
    if not isinstance(dtype, str) or dtype not in _DTYPE_BYTES:
        raise ConfigError(f"model config {where}: torch_dtype={dtype!r}; allowed: {', '.join(_DTYPE_BYTES)}")
    act = cfg.get("hidden_act", "silu")
    quant = cfg.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, Mapping) else quant
    if quant is not None and method not in QUANTIZATIONS:
        raise ConfigError(f"model config {where}: quantization_config.quant_method={method!r}; allowed: "
                          f"{', '.join(QUANTIZATIONS)} (or no quantization_config: weights in torch_dtype)")
    try:
        return ModelArchitecture(
            name=name or str(cfg.get("_name_or_path") or (where if where != "config dict" else "custom")),
            num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"], num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
            max_model_len=cfg["max_position_embeddings"],
            gated_mlp=act in ("silu", "swiglu") or cfg.get("model_type") in ("llama", "mistral", "qwen2"),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
            dtype_bytes=_DTYPE_BYTES[dtype], quantization=method if quant is not None else None)
    except ConfigError as err:
        raise ConfigError(f"model config {where}: {err}") from None


# ---------------------------------------------------------------------------------------------
# Shipped architectures: the public config.json of each model on the Hugging Face hub.

ARCHITECTURES: dict[str, ModelArchitecture] = {a.name: a for a in (
    # meta-llama/Llama-2-{7b,13b,70b}-hf: 6.74B, 13.02B, 68.98B parameters.
    ModelArchitecture("llama2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096),
    ModelArchitecture("llama2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 4096),
    ModelArchitecture("llama2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 4096),
    # meta-llama/Llama-3.1-{8B,70B}: 8.03B, 70.55B; 128k context (max_position_embeddings 131072).
    ModelArchitecture("llama3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072),
    ModelArchitecture("llama3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 131072),
    # mistralai/Mistral-7B-v0.3: 7.25B; vocabulary 32768, no sliding window (v0.1 had one).
    ModelArchitecture("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32768, 32768),
    # Qwen/Qwen2-7B: 7.62B; q/k/v biases; 28 heads of 128, 4 KV heads.
    ModelArchitecture("qwen2-7b", 28, 3584, 28, 4, 128, 18944, 152064, 131072, qkv_bias=True),
)}

SMOLLM2_135M = ModelArchitecture("smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, 8192, tied_embeddings=True)
"""HuggingFaceTB/SmolLM2-135M-Instruct (config.json; 134.5M parameters): the model served by the
llama.cpp backends (docs/serving.md). Not in ARCHITECTURES: that registry spans the GPU catalog
(every model on every GPU), and this model's only preset is the one measured on llama.cpp
(``latency.py``: smollm2-135m-llamacpp-cpu)."""

PUBLISHED_PARAMS: dict[str, float] = {
    "llama2-7b": 6.74e9, "llama2-13b": 13.02e9, "llama2-70b": 68.98e9, "llama3.1-8b": 8.03e9,
    "llama3.1-70b": 70.55e9, "mistral-7b": 7.25e9, "qwen2-7b": 7.62e9,
}
"""Parameter counts as published on each model card (safetensors totals), for the tests."""


def get_architecture(name: str) -> ModelArchitecture:
    """Shipped architecture by name; the error lists the valid names."""
    return lookup("model architecture", ARCHITECTURES, name)
