"""Hardware presets from architecture x GPU datasheet x tensor parallel (roofline, memory, catalog)."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import llm_lb_gym  # noqa: F401  (registers the env)
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.data import default_data_dir
from llm_lb_gym.sim import memory, roofline as rl
from llm_lb_gym.sim.architecture import ARCHITECTURES, PUBLISHED_PARAMS, from_hf_config, get_architecture
from llm_lb_gym.sim.catalog import ArchitecturePreset, build_preset, custom_preset
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.gpus import GPUS, get_gpu
from llm_lb_gym.sim.latency import PRESETS, get_preset
from llm_lb_gym.sim.simulate import simulate
from llm_lb_gym.workload.batch import poisson_batch

VIDUR = default_data_dir() / "profiling" / "vidur"
needs_data = pytest.mark.skipif(not VIDUR.is_dir(), reason=f"profiling data absent at {VIDUR}")

LLAMA2_7B_CONFIG = {  # meta-llama/Llama-2-7b-hf config.json (the keys we read)
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    "max_position_embeddings": 4096, "hidden_act": "silu", "tie_word_embeddings": False,
    "torch_dtype": "float16",
}


# --- architectures -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_parameter_count_matches_the_published_one(name: str) -> None:
    assert ARCHITECTURES[name].num_params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)


def test_derived_sizes_of_llama2_7b() -> None:
    a = get_architecture("llama2-7b")
    assert a.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2 == 524288
    assert get_architecture("llama3.1-8b").kv_bytes_per_token == 131072   # GQA: 8 KV heads
    assert a.linear_flops_per_token == 2 * 32 * (4 * 4096 ** 2 + 3 * 4096 * 11008)
    assert a.attention_flops_per_pair == 4 * 32 * 32 * 128


def test_hf_config_parses_to_the_shipped_architecture(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA2_7B_CONFIG))
    for source in (path, tmp_path, LLAMA2_7B_CONFIG):   # file, its folder, the dict
        a = from_hf_config(source, name="llama2-7b")
        assert a == get_architecture("llama2-7b")


def test_hf_config_errors_name_the_file_and_the_key(tmp_path) -> None:
    bad = {k: v for k, v in LLAMA2_7B_CONFIG.items() if k != "intermediate_size"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match=f"{path}.*intermediate_size"):
        from_hf_config(path)
    with pytest.raises(ConfigError, match="nowhere.json: file not found"):
        from_hf_config(tmp_path / "nowhere.json")
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        from_hf_config(path)
    path.write_text(json.dumps({**LLAMA2_7B_CONFIG, "num_key_value_heads": 5}))
    with pytest.raises(ConfigError, match="num_kv_heads"):
        from_hf_config(path)


def test_unknown_architecture_and_gpu_list_valid_names() -> None:
    with pytest.raises(ConfigError, match="llama2-70b.*qwen2-7b"):
        get_architecture("gpt-5")
    with pytest.raises(ConfigError, match="a100-80gb.*v100-16gb"):
        get_gpu("b200")


# --- roofline and tensor parallel -----------------------------------------------------------


@pytest.mark.parametrize("model", ["llama2-7b", "llama2-70b", "qwen2-7b"])
def test_more_gpus_compute_faster_and_all_reduce_costs(model: str) -> None:
    arch, gpu = ARCHITECTURES[model], GPUS["h100-80gb"]
    tps = [t for t in (1, 2, 4, 8) if not arch.num_heads % t]
    f = {tp: rl.derive_fields(arch, gpu, tp, cpu=False) for tp in tps}
    for a, b in zip(tps, tps[1:]):
        assert f[b]["compute_token_s"] < f[a]["compute_token_s"]
        assert f[b]["prefill_attn_s"] < f[a]["prefill_attn_s"]
        assert f[b]["decode_ctx_s"] <= f[a]["decode_ctx_s"]
        # the weight-read floor shrinks too, but the all-reduce latency is added
        assert rl.gemm_layer_s(arch, gpu, b, 1) < rl.gemm_layer_s(arch, gpu, a, 1)
    for tp in tps[1:]:
        assert rl.allreduce_s(gpu, tp, 1 << 20) > rl.allreduce_s(gpu, tp, 0) > 0
        no_comm = f[1]["token_s"]
        assert f[tp]["token_s"] > 0 and f[tp]["base_s"] > 0
    assert rl.allreduce_s(gpu, 1, 1 << 20) == 0.0 and no_comm > 0


def test_knee_is_where_compute_overtakes_the_weight_read() -> None:
    arch, gpu = ARCHITECTURES["llama2-7b"], GPUS["a100-80gb"]
    f = rl.derive_fields(arch, gpu, 1, lm_head=False, cpu=False)
    eff = rl.CALIBRATED
    assert f["knee_tokens"] == pytest.approx(
        2 * gpu.fp16_flops * eff.linear_flops / (2 * gpu.memory_bandwidth_bytes_s * eff.weight_bandwidth))
    # the contract's base + compute beyond the knee equals the per-layer roofline's max
    for n in (1, 64, int(f["knee_tokens"]) + 1, 4096):
        gemm = arch.num_layers * (rl.gemm_layer_s(arch, gpu, 1, n) - rl.GEMMS_PER_LAYER * eff.gemm_launch_s)
        floor = arch.num_layers * rl.gemm_weight_bytes(arch, 1) / (gpu.memory_bandwidth_bytes_s * eff.weight_bandwidth)
        assert gemm == pytest.approx(floor + f["compute_token_s"] * max(0, n - f["knee_tokens"]), rel=1e-9)


def test_latency_model_equals_the_contract_formula() -> None:
    f = build_preset(ARCHITECTURES["llama2-7b"], GPUS["a100-80gb"], 1).contract_fields
    lat = rl.to_latency_model(f)
    for p in (64, 1024, 4096):
        assert lat.iteration_s(p, p * (p + 1) // 2) == pytest.approx(
            rl.contract_step_s(f, tokens=p, pairs=p * (p + 1) // 2, num_seqs=1), rel=1e-12)
    assert lat.iteration_s(0, 0, 8, 8 * 1000) == pytest.approx(
        rl.contract_step_s(f, tokens=8, decode_seqs=8, decode_ctx_tokens=8000), rel=1e-12)


def test_invalid_tensor_parallel_names_the_allowed_degrees() -> None:
    with pytest.raises(ConfigError, match="tensor_parallel=8.*allowed: 1, 2, 4"):
        rl.derive_fields(ARCHITECTURES["qwen2-7b"], GPUS["h100-80gb"], 8)


# --- memory ---------------------------------------------------------------------------------


def test_70b_does_not_fit_one_80gb_gpu_but_fits_two() -> None:
    arch, gpu = ARCHITECTURES["llama2-70b"], GPUS["h100-80gb"]
    kw = dict(block_size=16, gpu_memory_utilization=0.9, max_num_batched_tokens=4096, max_num_seqs=128)
    with pytest.raises(ConfigError, match="engine.gpu_memory_utilization.*max_num_batched_tokens"):
        memory.num_kv_blocks(arch, gpu, 1, **kw)
    assert memory.num_kv_blocks(arch, gpu, 2, **kw) > 0
    assert memory.num_kv_blocks(arch, gpu, 4, **kw) > 2 * memory.num_kv_blocks(arch, gpu, 2, **kw)
    assert "llama2-70b/h100-80gb/tp1" not in PRESETS and "llama2-70b/h100-80gb/tp2" in PRESETS


def test_v100_16gb_has_fewer_blocks_than_32gb() -> None:
    small = get_preset("llama2-7b-v100-16gb").num_kv_blocks(16, 0.9, 4096, 128)
    big = get_preset("llama2-7b/v100-32gb/tp1").num_kv_blocks(16, 0.9, 4096, 128)
    assert 0 < small < big
    # one GiB more of utilization headroom is 128 more 8-MiB blocks
    more = get_preset("llama2-7b-v100-16gb").num_kv_blocks(16, 0.9 + 1 / 15.77, 4096, 128)
    assert more - small == pytest.approx(128, abs=1)


def test_larger_token_budget_leaves_fewer_blocks() -> None:
    p = get_preset("llama3.1-8b/a100-80gb/tp1")
    assert p.num_kv_blocks(16, 0.9, 16384, 128) < p.num_kv_blocks(16, 0.9, 2048, 128)


def test_memory_model_reproduces_vllms_published_block_count() -> None:
    # Llama-2-7B on one A100-80GB at vLLM's defaults: 7,351 blocks (vllm-project/vllm#2031)
    blocks = memory.num_kv_blocks(ARCHITECTURES["llama2-7b"], GPUS["a100-80gb"], 1, block_size=16,
                                  gpu_memory_utilization=0.9, max_num_batched_tokens=4096, max_num_seqs=256)
    assert abs(blocks - 7351) <= 5


def test_engine_config_derives_blocks_from_the_catalog_memory_model() -> None:
    cfg = EngineConfig(preset="llama2-7b/a100-80gb/tp1", max_num_seqs=256)
    assert cfg.total_blocks == get_preset(cfg.preset).num_kv_blocks(16, 0.9, cfg.token_budget, 256)
    assert cfg.context_len == 4096
    assert EngineConfig(preset="llama3.1-8b/h100-80gb/tp1").context_len == 8192   # serving default
    # the four hand-set presets keep their fixed reserve and block counts
    assert EngineConfig().total_blocks == get_preset("llama2-7b-v100").num_kv_blocks(16, 0.9)


def test_custom_model_config_on_a_gpu(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA2_7B_CONFIG))
    cfg = EngineConfig(model_config=str(path), gpu="a100-80gb", tensor_parallel=2)
    ref = get_preset("llama2-7b/a100-80gb/tp2")
    assert cfg.latency_model == ref.latency
    assert cfg.total_blocks == ref.num_kv_blocks(16, 0.9, cfg.token_budget, cfg.max_num_seqs)
    with pytest.raises(ConfigError, match="engine.model_config needs engine.gpu"):
        EngineConfig(model_config=str(path))
    with pytest.raises(ConfigError, match="engine.gpu and engine.tensor_parallel"):
        EngineConfig(gpu="l4")
    with pytest.raises(ConfigError, match="unknown gpu 'b200'"):
        EngineConfig(model_config=str(path), gpu="b200")
    assert isinstance(custom_preset(str(path), "l4", 1), ArchitecturePreset)


def test_hydra_overrides_select_catalog_and_custom_presets(tmp_path) -> None:
    from hydra import compose, initialize_config_dir

    from llm_lb_gym.experiments._hydra import CONF_DIR, env_kwargs

    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA2_7B_CONFIG))
    cases = {"llama2-70b/h100-80gb/tp4": ["engine.preset=llama2-70b/h100-80gb/tp4"],
             "llama2-70b/h100-80gb/tp4 ": ["engine=h100_llama70b_tp4"],
             f"{path}/l4/tp2": [f"engine.model_config={path}", "engine.gpu=l4", "engine.tensor_parallel=2"]}
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for name, overrides in cases.items():
            engine = EngineConfig(**env_kwargs(compose(config_name="train", overrides=overrides))["engine"])
            assert engine.hardware.name == name.strip()


def test_unknown_preset_lists_names_grouped_by_model() -> None:
    with pytest.raises(ConfigError, match=r"llama2-7b-v100.*; llama2-13b/\{a100-40gb/tp1, "):
        get_preset("llama2-7b/t4/tp1")


# --- every shipped preset runs ----------------------------------------------------------------


def test_catalog_covers_the_required_models_and_gpus() -> None:
    names = set(PRESETS)
    for model in ARCHITECTURES:
        for gpu in GPUS:
            assert any(n.startswith(f"{model}/{gpu}/") for n in names) or model.endswith("70b"), (model, gpu)
    for legacy in ("llama2-7b-v100", "llama2-7b-a100", "llama3-8b-a100", "llama2-7b-h100", "llama2-7b-v100-16gb"):
        assert legacy in names


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_runs_a_short_episode(name: str) -> None:
    env = gym.make("LLMCluster-v0", engine={"preset": name}, num_instances=2, num_requests=10,
                   arrival_rate_rps=5.0)
    env.reset(seed=0)
    steps, done = 0, False
    while not done:
        _, _, term, trunc, info = env.step(steps % 2)
        done, steps = term or trunc, steps + 1
    assert term and not trunc
    batch = poisson_batch(np.random.default_rng(0), 12, 5.0, 200, 30)
    assert simulate(batch, ClusterConfig(num_instances=2, engine=EngineConfig(preset=name))).done


# --- calibration (real profiles) --------------------------------------------------------------


@pytest.fixture(scope="module")
def hardware_calibration():
    from llm_lb_gym.calibration.calibrate_hardware import calibrate_hardware
    from llm_lb_gym.data import DataNotFoundError

    try:
        return calibrate_hardware(log=lambda _: None, table=False)
    except DataNotFoundError as err:
        pytest.skip(f"profiling data absent: {err}")


@needs_data
def test_library_constants_are_the_fit(hardware_calibration) -> None:
    from dataclasses import fields

    for f in fields(rl.Efficiency):
        assert getattr(rl.CALIBRATED, f.name) == pytest.approx(getattr(hardware_calibration.efficiency, f.name),
                                                                rel=2e-3), f.name
    assert rl.ALLREDUCE_LATENCY_S == pytest.approx(hardware_calibration.allreduce[0], rel=2e-3)
    for tp, (b, s, _) in hardware_calibration.cpu.items():
        assert rl.CPU_OVERHEAD_BY_TP[tp] == pytest.approx((b, s), rel=2e-3)
    assert memory.NON_TORCH_BYTES == pytest.approx(hardware_calibration.non_torch_bytes, rel=2e-3)


@needs_data
def test_leave_one_gpu_out_errors_are_bounded(hardware_calibration) -> None:
    # measured (docs/hardware.md): median |rel err| of the linear layers 1.7-18.8%, max 19.9-49.7%
    for held, by_tp in hardware_calibration.loo.items():
        for tp, (linear, ops) in by_tp.items():
            assert np.median(np.abs(linear)) < 0.20, (held, tp)
            assert np.median(np.abs(ops)) < 0.15, (held, tp)
            assert np.abs(ops).max() < 0.45, (held, tp)


@needs_data
def test_composed_step_time_error_on_profiled_gpus(hardware_calibration) -> None:
    for g, errs in hardware_calibration.composed.items():
        for phase, e in errs.items():
            assert np.median(np.abs(e)) < 0.08, (g, phase)
            assert np.abs(e).max() < 0.30, (g, phase)
