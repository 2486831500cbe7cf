"""Engine generations: a serving engine's release line and its defaults, as engine presets.

Why: the same model on the same GPU behaves differently under vLLM V0 and V1 because their
scheduler defaults differ (chunked prefill, the token budget and the sequence cap by GPU
memory class, prefix caching), and V1 adds a separate API-server process whose per-request work
bounds short-request throughput (``frontend.py``). A study that names "vLLM 0.11 on an H100"
should get those defaults without looking them up; :func:`generation_options` returns them as
``EngineConfig`` options (any explicit option wins), ``conf/engine/vllm_v1_*.yaml`` holds them
per GPU class for Hydra.

Sources: vLLM's ``EngineArgs`` defaults (``vllm/engine/arg_utils.py``): V1 (the default engine
from 0.8.0; the rule below unchanged through 0.27): for the OpenAI API server a token budget of
8,192 and 1,024 sequences on GPUs with >= 70 GiB that are not A100s, else 2,048 and 256 (the
A100 exception: vllm-project/vllm#17885); chunked prefill and prefix caching on; async
scheduling an option (``--async-scheduling``) until it became the default in 0.14.0 (release
notes: "Async scheduling is now enabled by default (#27614)"; the scheduler runs one step ahead
of the GPU, vllm-project/vllm#19970), so :func:`generation_options` sets
``async_scheduling`` by the engine version it is given; KV blocks allocated
per scheduled chunk (``KVCacheManager.allocate_slots``), where V0's block manager reserved a
prompt's blocks when it was admitted. V0 (0.6-0.7): no
chunked prefill below 32k context (token budget max(context, 2,048)), 256 sequences, prefix
caching off, the API server in the engine's process. docs/calibration.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .._validate import ConfigError, lookup
from .gpus import GIB, GPUDatasheet

BIG_GPU_BYTES = 70 * GIB
"""V1's threshold for its larger defaults (``device_memory >= 70 GiB and "a100" not in name``)."""


@dataclass(frozen=True)
class EngineGeneration:
    """The defaults of one engine release line (``EngineConfig`` options)."""

    name: str
    versions: str
    chunked_prefill: bool
    kv_allocation: str
    """``EngineConfig.kv_allocation``: V1 allocates a prefill's KV blocks chunk by chunk."""
    enable_prefix_caching: bool
    big_gpu_budget_tokens: int | None
    """Token budget on GPUs of >= 70 GiB that are not A100s (None: max(context, 2,048))."""
    big_gpu_max_seqs: int
    small_gpu_budget_tokens: int | None
    small_gpu_max_seqs: int
    frontend: str | None
    """The API server's per-request work (``frontend.FRONTENDS``), None: not modelled."""
    latency_fit: str
    """``EngineConfig.latency_fit`` of ``model_config`` presets: ``serving`` = the per-GPU factors
    fitted to real end-to-end runs of this engine (``roofline.SERVING_SCALES``)."""
    async_scheduling_from: tuple[int, int, int] | None = None
    """First release with async scheduling on by default (None: never in this line)."""

    def big(self, gpu: GPUDatasheet) -> bool:
        return gpu.memory_bytes >= BIG_GPU_BYTES and "a100" not in gpu.name

    def async_scheduling(self, version: str | None) -> bool:
        """Whether release ``version`` ("0.14.0") schedules asynchronously by default; an
        unnamed version gets the line's first release (synchronous where that is)."""
        if version is None or self.async_scheduling_from is None:
            return False
        return parse_version(version) >= self.async_scheduling_from

    def options(self, gpu: GPUDatasheet, version: str | None = None) -> dict:
        big = self.big(gpu)
        out = {"chunked_prefill": self.chunked_prefill, "kv_allocation": self.kv_allocation,
               "enable_prefix_caching": self.enable_prefix_caching,
               "max_num_seqs": self.big_gpu_max_seqs if big else self.small_gpu_max_seqs,
               "latency_fit": self.latency_fit, "async_scheduling": self.async_scheduling(version)}
        budget = self.big_gpu_budget_tokens if big else self.small_gpu_budget_tokens
        if budget is not None:
            out["max_num_batched_tokens"] = budget
        if self.frontend is not None:
            out["frontend"] = self.frontend
        return out


GENERATIONS: dict[str, EngineGeneration] = {g.name: g for g in (
    EngineGeneration("vllm-v1", "vLLM 0.8.0 and later (V1 engine, OpenAI API server)", chunked_prefill=True,
                     kv_allocation="chunk", enable_prefix_caching=True, big_gpu_budget_tokens=8192, big_gpu_max_seqs=1024,
                     small_gpu_budget_tokens=2048, small_gpu_max_seqs=256, frontend="vllm-v1-api",
                     latency_fit="serving", async_scheduling_from=(0, 14, 0)),
    EngineGeneration("vllm-v0", "vLLM 0.6.x-0.7.x (V0 engine)", chunked_prefill=False, kv_allocation="request",
                     enable_prefix_caching=False,
                     big_gpu_budget_tokens=None, big_gpu_max_seqs=256, small_gpu_budget_tokens=None,
                     small_gpu_max_seqs=256, frontend=None, latency_fit="kernels"),
)}


def get_generation(name: str) -> EngineGeneration:
    return lookup("engine generation", GENERATIONS, name)


def parse_version(version: str) -> tuple[int, int, int]:
    """``"0.14.0"`` -> (0, 14, 0); a suffix after the numbers (``0.14.0rc1``, ``0.11.0+cu128``)
    is ignored, a missing patch is 0."""
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", str(version).strip())
    if m is None:
        raise ConfigError(f"engine version {version!r}: expected MAJOR.MINOR[.PATCH], e.g. 0.14.0")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def generation_options(name: str, gpu: GPUDatasheet, version: str | None = None, **overrides) -> dict:
    """``EngineConfig`` options of generation ``name`` at release ``version`` on ``gpu``;
    ``overrides`` win."""
    return {**get_generation(name).options(gpu, version), **overrides}
