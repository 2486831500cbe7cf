"""FP8 weights (``engine.quantization``, ``architecture.quantization``): bytes, GEMM rate, memory."""

from __future__ import annotations

import json

import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.sim import roofline
from llm_lb_gym.sim.architecture import ARCHITECTURES, from_hf_config
from llm_lb_gym.sim.config import EngineConfig
from llm_lb_gym.sim.gpus import GPUS, declare_gpu
from dataclasses import replace

QWEN3_8B = {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
            "max_position_embeddings": 40960, "hidden_act": "silu", "tie_word_embeddings": False,
            "attention_bias": False, "torch_dtype": "bfloat16"}
"""Qwen/Qwen3-8B's config.json (the fields the architecture reads)."""


def test_fp8_halves_the_linear_weights_only():
    a = from_hf_config(QWEN3_8B)
    q = replace(a, quantization="fp8")
    linear = a.num_layers * a.linear_params_per_layer
    assert a.weight_bytes - q.weight_bytes == linear   # 2 bytes -> 1 for the matrix multiplies
    assert q.weight_bytes == linear + 2 * (a.num_params - linear)   # embedding, LM head, norms in BF16
    assert q.kv_bytes_per_token == a.kv_bytes_per_token and q.linear_weight_bytes == 1


def test_a_checkpoint_s_quantization_config_is_read_and_others_are_refused(tmp_path):
    cfg = {**QWEN3_8B, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    assert from_hf_config(cfg).quantization == "fp8"
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN3_8B, "quantization_config": {"quant_method": "awq", "bits": 4}}))
    with pytest.raises(ConfigError, match=r"config.json: quantization_config.quant_method='awq'; allowed: fp8"):
        from_hf_config(path)
    with pytest.raises(ConfigError, match="architecture.quantization='int4' is not valid; allowed: fp8"):
        replace(ARCHITECTURES["llama2-7b"], quantization="int4")


def test_fp8_gemms_run_at_the_fp8_peak_only_where_the_gpu_has_one():
    a = from_hf_config(QWEN3_8B)
    q = replace(a, quantization="fp8")
    for gpu, compute_ratio in (("h100-80gb", 0.5), ("l4", 0.5), ("a100-80gb", 1.0)):
        g = GPUS[gpu]
        fa, fq = roofline.derive_fields(a, g), roofline.derive_fields(q, g)
        assert fq["compute_token_s"] / fa["compute_token_s"] == pytest.approx(compute_ratio, rel=5e-3), gpu   # datasheet peaks: 1,979 / 989.4, 242.5 / 121
        # the weight read halves everywhere: decode at batch 1 speeds up on every GPU
        read = roofline.gemm_weight_bytes(a, 1) / roofline.gemm_weight_bytes(q, 1)
        assert read == 2.0 and fq["base_s"] < fa["base_s"]
        # Hopper / Ada: half the bytes and twice the FLOPs, same knee; Ampere's weight-only kernels halve it
        assert fq["knee_tokens"] / fa["knee_tokens"] == pytest.approx(1.0 if compute_ratio == 0.5 else 0.5, rel=5e-3)


def test_engine_quantization_is_checked_and_frees_kv_memory_as_vllm_reports(tmp_path):
    """silybench's runs of Qwen3-8B on one H100 at gpu_memory_utilization 0.9 and max_model_len
    16384: vLLM reported KV caches of 377,024 tokens (BF16) and 430,272 (``--quantization fp8``);
    the memory model gives each within 4% and their ratio within 2%."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_8B))
    kw = dict(model_config=str(path), gpu="h100-80gb", gpu_memory_utilization=0.9, max_model_len=16384,
              max_num_batched_tokens=8192, max_num_seqs=1024, chunked_prefill=True)
    bf16, fp8 = EngineConfig(**kw), EngineConfig(**kw, quantization="fp8")
    tokens = {e: e.total_blocks * e.block_size for e in (bf16, fp8)}
    assert tokens[bf16] / 377_024 - 1 == pytest.approx(0, abs=0.04)
    assert tokens[fp8] / 430_272 - 1 == pytest.approx(0, abs=0.04)
    assert (tokens[fp8] / tokens[bf16]) / (430_272 / 377_024) == pytest.approx(1, abs=0.02)
    assert fp8.latency_model.base_s < 0.75 * bf16.latency_model.base_s
    assert fp8.hardware.name.endswith("/fp8")
    with pytest.raises(ConfigError, match="engine.quantization='int8' is not valid; allowed: fp8"):
        EngineConfig(**kw, quantization="int8")
    with pytest.raises(ConfigError, match="engine.quantization applies to engine.model_config presets only"):
        EngineConfig(quantization="fp8")


def test_a_declared_gpu_may_leave_out_its_fp8_peak():
    spec = {"name": "a30", "memory_bytes": 25.2e9, "memory_bandwidth_bytes_s": 933e9, "fp16_flops": 165e12,
            "interconnect_bytes_s": 32e9, "interconnect": "pcie"}
    assert declare_gpu(spec).fp8_flops == 0.0
    assert declare_gpu({**spec, "name": "l40s-ish", "fp8_flops": 733e12}).fp8_flops == 733e12
    with pytest.raises(ConfigError, match=r"engine.gpu.fp8_flops='fast' must be a number >= 0"):
        declare_gpu({**spec, "fp8_flops": "fast"})
    with pytest.raises(ConfigError, match="engine.gpu.fp8_flops"):
        declare_gpu({**spec, "fp8_flops": -1.0})
    with pytest.raises(ConfigError, match=r"missing field\(s\) fp16_flops; .*\(optional: fp8_flops;"):
        declare_gpu({k: v for k, v in spec.items() if k != "fp16_flops"})
