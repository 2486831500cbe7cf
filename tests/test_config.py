"""Bad options fail at construction with a message naming the option and what is allowed."""

from __future__ import annotations

import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs.config import EnvConfig
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.latency import LatencyModel, get_preset
from llm_lb_gym.workload.arrivals import PoissonArrivals


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(block_size=0), r"engine\.block_size=0 .*allowed: \[1, 1048576\]"),
    (dict(block_size=2**63), r"engine\.block_size=9223372036854775808 .*allowed: \[1, 1048576\]"),
    (dict(max_num_seqs=0), r"engine\.max_num_seqs=0 .*allowed"),
    (dict(max_num_batched_tokens=0), r"engine\.max_num_batched_tokens=0"),
    (dict(scheduler="lifo"), r"engine\.scheduler='lifo' is not valid; allowed: fcfs, least_work_left, bin_packing"),
    (dict(preset="gpt5-tpu"), r"unknown hardware preset 'gpt5-tpu'; allowed: .*llama2-7b-v100"),
    (dict(gpu_memory_utilization=1.5), r"engine\.gpu_memory_utilization=1\.5 is out of range"),
    (dict(watermark=-0.1), r"engine\.watermark"),
    (dict(chunked_prefill=True, max_num_batched_tokens=64), r"must be >= engine\.max_num_seqs=128"),
    (dict(max_num_batched_tokens=1024), r"must be >= max_model_len=4096 without chunked_prefill"),
])
def test_engine_config_errors(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        EngineConfig(**kwargs)


def test_other_config_errors():
    with pytest.raises(ConfigError, match=r"cluster\.num_instances=0"):
        ClusterConfig(num_instances=0)
    with pytest.raises(ConfigError, match=r"rate_rps"):
        PoissonArrivals(-1.0)
    with pytest.raises(ConfigError, match=r"arrival_rate_rps=-5"):
        EnvConfig(arrival_rate_rps=-5)
    with pytest.raises(ConfigError, match=r"decision_interval_s=0"):
        EnvConfig(decision_interval_s=0)
    with pytest.raises(ConfigError, match=r"unknown engine option\(s\): shceduler; allowed: .*scheduler"):
        EnvConfig(engine={"shceduler": "fcfs"})
    with pytest.raises(ConfigError, match=r"latency\.decode_ctx_s"):
        LatencyModel(base_s=0.01, token_s=1e-4, decode_seq_s=1e-4, decode_ctx_s=-1e-6)


def test_kv_capacity_is_derived_from_memory():
    # Llama-2-7B fp16 on a 32 GB V100 at 90%: (0.9*32 GiB - 13.48 GB - 1.5 GiB) / (16 * 512 KiB)
    blocks = EngineConfig().total_blocks
    assert blocks == get_preset("llama2-7b-v100").num_kv_blocks(16, 0.9)
    assert 1500 < blocks < 2200
    assert EngineConfig(num_kv_blocks=123).total_blocks == 123
    assert EngineConfig(num_kv_blocks=1000).watermark_blocks == 10
