"""Typed configuration of one inference instance (engine) and of the cluster.

Defaults are vLLM v0's for Llama-2-7B: block size 16, 1% watermark, 128 sequences, a token budget
of max(max_model_len, 2048) without chunking, FCFS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .._validate import ConfigError, check_bool, check_choice, check_int, check_range
from ..limits import MAX_CONTEXT_TOKENS, MAX_TOKENS
from .batching import SCHEDULERS
from .catalog import custom_preset
from .gpus import GPUS
from .latency import HardwarePreset, LatencyModel, get_preset


@dataclass(frozen=True)
class EngineConfig:
    """Options of one vLLM-style instance."""

    preset: str = "llama2-7b-v100"
    """Hardware preset (model on GPU): latency coefficients and memory sizes; the hand-set ones or
    a catalog name ``<model>/<gpu>/tp<k>`` (docs/hardware.md)."""
    block_size: int = 16
    """Tokens per KV-cache block."""
    gpu_memory_utilization: float = 0.9
    """Share of GPU memory vLLM may use (weights + activations + KV cache)."""
    num_kv_blocks: int | None = None
    """KV blocks; derived from the preset's memory when None."""
    watermark: float = 0.01
    """Share of blocks kept free when admitting a prefill (vLLM's 1%)."""
    max_num_seqs: int = 128
    """Most sequences in a batch (running + prefilling)."""
    max_num_batched_tokens: int | None = None
    """Token budget of one iteration; None = max(max_model_len, 2048) without chunking, 2048 with."""
    max_model_len: int | None = None
    """Context window; None = the preset model's."""
    chunked_prefill: bool = False
    """Mix decodes and prefill chunks in one iteration under a token budget (vLLM v1, Sarathi)."""
    scheduler: str = "fcfs"
    """Order of admission from the waiting queue: fcfs, least_work_left, bin_packing
    (``sim/batching.py`` defines each)."""
    latency: LatencyModel | None = None
    """Override the preset's latency coefficients."""
    cpu_overhead: bool = True
    """Count the latency model's CPU overhead per iteration (``cpu_base_s + cpu_seq_s * n_seqs``:
    scheduling, sampling, input preparation, output processing; presets without profiled CPU
    overheads have zeros there). False models a GPU-bound engine whose CPU work overlaps the
    forward pass (e.g. vLLM's async output processing / multi-step scheduling) and compares with
    profile simulators that leave the CPU side out."""
    model_config: str | None = None
    """Path to a Hugging Face config.json (or its folder): a roofline preset of that architecture on
    ``gpu`` x ``tensor_parallel`` replaces ``preset`` (llm_lb_gym/sim/catalog.py)."""
    gpu: str | None = None
    """GPU of ``model_config`` (a name of llm_lb_gym.sim.gpus.GPUS)."""
    tensor_parallel: int = 1
    """GPUs per instance for ``model_config``."""
    enable_prefix_caching: bool = False
    """Automatic prefix caching (vLLM's option of the same name): KV blocks of prompt prefixes
    computed before are reused by later requests carrying the same block hashes
    (docs/prefix_caching.md). Off: the engine never looks at hashes."""

    def __post_init__(self) -> None:
        if self.model_config is None and (self.gpu is not None or self.tensor_parallel != 1):
            raise ConfigError("engine.gpu and engine.tensor_parallel apply to engine.model_config only; "
                              "catalog presets name them: engine.preset=<model>/<gpu>/tp<k>")
        if self.model_config is not None and self.gpu is None:
            raise ConfigError("engine.model_config needs engine.gpu; allowed: " + ", ".join(GPUS))
        self.hardware  # validates the preset name (or the custom model on its GPU)
        check_int("engine.block_size", self.block_size, 1)
        check_range("engine.gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, lo_open=True)
        if self.num_kv_blocks is not None:
            check_int("engine.num_kv_blocks", self.num_kv_blocks, 1, MAX_TOKENS)
        check_range("engine.watermark", self.watermark, 0.0, 1.0, hi_open=True)
        check_int("engine.max_num_seqs", self.max_num_seqs, 1, MAX_TOKENS)
        if self.max_num_batched_tokens is not None:
            check_int("engine.max_num_batched_tokens", self.max_num_batched_tokens, 1, MAX_CONTEXT_TOKENS)
        if self.max_model_len is not None:
            check_int("engine.max_model_len", self.max_model_len, 2, MAX_CONTEXT_TOKENS)
        check_choice("engine.scheduler", self.scheduler, SCHEDULERS)
        check_bool("engine.chunked_prefill", self.chunked_prefill)
        check_bool("engine.cpu_overhead", self.cpu_overhead)
        check_bool("engine.enable_prefix_caching", self.enable_prefix_caching)
        if self.chunked_prefill and self.token_budget < self.max_num_seqs:
            raise ConfigError(
                f"engine.max_num_batched_tokens={self.token_budget} must be >= engine.max_num_seqs="
                f"{self.max_num_seqs} with chunked_prefill (every running decode takes one token)"
            )
        if not self.chunked_prefill and self.token_budget < self.context_len:
            raise ConfigError(
                f"engine.max_num_batched_tokens={self.token_budget} must be >= max_model_len="
                f"{self.context_len} without chunked_prefill (as vLLM v0 requires): a preempted "
                "request re-prefills prompt + generated tokens and must fit in one iteration"
            )
        if self.latency is not None and not isinstance(self.latency, LatencyModel):
            object.__setattr__(self, "latency", LatencyModel(**dict(self.latency)))

    @property
    def hardware(self) -> HardwarePreset:
        if self.model_config is not None:
            return custom_preset(str(self.model_config), self.gpu, self.tensor_parallel)
        return get_preset(self.preset)

    @property
    def latency_model(self) -> LatencyModel:
        """The coefficients every iteration time is computed from (engine, reference, ideal
        latency): the override or the preset's, without the CPU terms if ``cpu_overhead`` is off."""
        lat = self.latency if self.latency is not None else self.hardware.latency
        return lat if self.cpu_overhead else lat.without_cpu()

    @property
    def context_len(self) -> int:
        return self.max_model_len if self.max_model_len is not None else self.hardware.model_spec.max_model_len

    @property
    def total_blocks(self) -> int:
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        return self.hardware.num_kv_blocks(self.block_size, self.gpu_memory_utilization,
                                           self.token_budget, self.max_num_seqs)

    @property
    def watermark_blocks(self) -> int:
        return math.ceil(self.watermark * self.total_blocks)

    @property
    def token_budget(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 2048 if self.chunked_prefill else max(self.context_len, 2048)


@dataclass(frozen=True)
class ClusterConfig:
    """m identical instances behind one router."""

    num_instances: int = 4
    engine: EngineConfig = field(default_factory=EngineConfig)
    fast: bool = True
    """Advance stretches of identical decode iterations in closed form; False = one iteration
    at a time (the reference mode the tests compare against)."""

    def __post_init__(self) -> None:
        check_int("cluster.num_instances", self.num_instances, 1)
        check_bool("cluster.fast", self.fast)
        if isinstance(self.engine, dict):
            object.__setattr__(self, "engine", EngineConfig(**self.engine))
