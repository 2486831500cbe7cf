"""One hardware model: every preset's memory from the architecture and the GPU datasheet, and a
GPU that is not built in declared in config by its datasheet fields."""

from __future__ import annotations

import dataclasses

import pytest

import llm_lb_gym  # noqa: F401  (registers the catalog)
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs import LLMClusterEnv
from llm_lb_gym.sim.config import EngineConfig
from llm_lb_gym.sim.gpus import GPUS
from llm_lb_gym.sim.latency import PRESETS

A30 = {"name": "a30", "memory_bytes": 24 * 1024**3 * 0.98, "memory_bandwidth_bytes_s": 933e9,
       "fp16_flops": 165e12, "interconnect_bytes_s": 32e9, "interconnect": "pcie"}
"""NVIDIA A30 datasheet: 24 GB HBM2 at 933 GB/s, 330 TFLOPS FP16 tensor with sparsity = 165
dense, PCIe Gen4 x16 (the NVLink bridge pairs two cards only)."""


@pytest.mark.parametrize("gpu", ["a100-80gb", "l4", "v100-32gb"])
def test_a_declared_gpu_equal_to_a_built_in_gives_the_same_preset(gpu):
    fields = {**dataclasses.asdict(GPUS[gpu]), "name": f"my-{gpu}"}
    declared = EngineConfig(model_config="llama2-7b", gpu=fields)
    built_in = EngineConfig(preset=f"llama2-7b/{gpu}/tp1")
    assert declared.latency_model == built_in.latency_model
    assert declared.total_blocks == built_in.total_blocks
    assert declared.context_len == built_in.context_len
    assert declared.hardware.contract == built_in.hardware.contract
    # and through the env's options, as YAML gives them
    env = LLMClusterEnv(engine={"model_config": "llama2-7b", "gpu": fields},
                                   num_requests=20)
    assert env.cluster_cfg.engines[0].total_blocks == built_in.total_blocks


def test_an_a30_can_be_declared_and_runs():
    e = EngineConfig(model_config="llama2-7b", gpu=A30)
    assert e.hardware.gpu == "a30" and 100 < e.total_blocks < 1889   # less memory than a 32 GB V100
    env = LLMClusterEnv(engine={"model_config": "llama2-7b", "gpu": A30},
                                   num_requests=30)
    env.reset(seed=0)
    done = False
    while not done:
        _, _, done, _, info = env.step(0)
    assert info["metrics"]["completed"] + info["metrics"]["rejected"] == 30


@pytest.mark.parametrize("change, message", [
    ({"memory_bytes": -1.0}, r"engine\.gpu\.memory_bytes"),
    ({"fp16_flops": "fast"}, r"engine\.gpu\.fp16_flops='fast' must be a positive number"),
    ({"interconnect": "infiniband"}, r"engine\.gpu\.interconnect.*nvlink, pcie"),
    ({"clock_mhz": 1440}, r"engine\.gpu: unknown field\(s\) clock_mhz; allowed: name, memory_bytes"),
    ({"name": "a100-80gb"}, r"engine\.gpu\.name='a100-80gb' is a built-in GPU with other figures"),
])
def test_a_bad_declaration_names_the_field(change, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(model_config="llama2-7b", gpu={**A30, **change})


def test_a_missing_field_is_named():
    spec = dict(A30)
    del spec["memory_bandwidth_bytes_s"]
    with pytest.raises(ConfigError, match=r"engine\.gpu: missing field\(s\) memory_bandwidth_bytes_s"):
        EngineConfig(model_config="llama2-7b", gpu=spec)


def test_hand_set_presets_size_memory_with_the_catalog_model():
    """The hand-fitted presets differ from the catalog only in latency: the default V100 preset
    has the catalog's 32 GB V100 KV cache (1,889 blocks; 1,887 with package 0.4's fixed reserve)."""
    for name, catalog_name in [("llama2-7b-v100", "llama2-7b/v100-32gb/tp1"),
                               ("llama2-7b-a100", "llama2-7b/a100-80gb/tp1"),
                               ("llama2-7b-h100", "llama2-7b/h100-80gb/tp1"),
                               ("llama3-8b-a100", "llama3.1-8b/a100-80gb/tp1")]:
        assert EngineConfig(preset=name).total_blocks == EngineConfig(preset=catalog_name).total_blocks
        assert PRESETS[name].model_spec == PRESETS[catalog_name].model_spec
    assert EngineConfig().total_blocks == 1889
