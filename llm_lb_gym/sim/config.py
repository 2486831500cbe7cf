"""Typed configuration of one inference instance (engine) and of the cluster.

Defaults are vLLM v0's for Llama-2-7B: block size 16, 1% watermark, 128 sequences, a token budget
of max(max_model_len, 2048) without chunking, FCFS.

A cluster is homogeneous (``num_instances`` copies of ``engine``) or mixed: ``instances`` lists
engine groups, each ``{count: n, **engine options}`` (or an ``EngineConfig``, count 1), whose
unset options come from ``engine``; e.g. 2 x A100 + 2 x V100 is
``instances=[{"preset": "llama2-7b-a100", "count": 2}, {"preset": "llama2-7b-v100", "count": 2}]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .._validate import ConfigError, check_bool, check_choice, check_int, check_range, reject_unknown
from ..limits import MAX_CONTEXT_TOKENS, MAX_INSTANCES, MAX_TOKENS
from .batching import SCHEDULERS
from .catalog import LATENCY_FITS, custom_preset
from .frontend import FrontendModel, resolve_frontend
from .architecture import QUANTIZATIONS
from .gpus import GPUS, GPUDatasheet, resolve_gpu
from .latency import HardwarePreset, LatencyModel, get_preset

KV_ALLOCATIONS = ("request", "chunk")
"""``EngineConfig.kv_allocation``: V0's whole-request reservation, V1's per-chunk allocation."""


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
    kv_allocation: str = "request"
    """When a prefill's KV blocks are allocated (docs/simulator_semantics.md): ``request`` = all of
    ``p + o`` at admission (vLLM V0's block manager; the default, as before the option) or
    ``chunk`` = each chunk's blocks as it is computed (vLLM V1's ``allocate_slots``; chunked
    prefill only). Under KV pressure ``chunk`` lets the next prompts prefill while the
    running requests decode, where ``request`` waits for room for the whole prompt."""
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
    async_scheduling: bool = False
    """Schedule the next iteration while the current one runs (vLLM's ``--async-scheduling``,
    its default from 0.14.0, ``sim/generations.py``): the CPU step (``cpu_base_s + cpu_seq_s *
    n_seqs``) overlaps the forward pass, so an iteration lasts ``max(GPU time, CPU time)`` instead
    of their sum, and a request that joins a busy instance is first scheduled one iteration later
    (the next one was scheduled before it came; docs/simulator_semantics.md). False (the default,
    vLLM before 0.14): the GPU waits for the CPU step, as before the option existed."""
    model_config: str | None = None
    """A built-in architecture name (llm_lb_gym.sim.architecture.ARCHITECTURES) or the path to a
    Hugging Face config.json (or its folder): a roofline preset of that architecture on ``gpu`` x
    ``tensor_parallel`` replaces ``preset`` (llm_lb_gym/sim/catalog.py)."""
    gpu: str | GPUDatasheet | None = None
    """GPU of ``model_config``: a name of llm_lb_gym.sim.gpus.GPUS, or a GPU declared by its
    datasheet fields (a mapping, ``gpus.declare_gpu``; docs/hardware.md)."""
    tensor_parallel: int = 1
    """GPUs per instance for ``model_config``."""
    enable_prefix_caching: bool = False
    """Automatic prefix caching (vLLM's option of the same name): KV blocks of prompt prefixes
    computed before are reused by later requests carrying the same block hashes
    (docs/prefix_caching.md). Off: the engine never looks at hashes."""
    latency_fit: str = "kernels"
    """Latency coefficients of a ``model_config`` preset: ``kernels`` (the roofline's factors
    fitted to Vidur's kernel profiles, as before the option) or ``serving`` (per-GPU factors
    fitted to real end-to-end vLLM runs, ``roofline.SERVING_SCALES``; docs/calibration.md)."""
    quantization: str | None = None
    """vLLM's ``--quantization`` for ``model_config`` presets: ``fp8`` serves the layers' matrix
    multiplies with FP8 weights (``architecture.QUANTIZATIONS``: half the weight bytes, more KV
    blocks, the FP8 tensor-core rate where the GPU has one). None: as the model config says (a
    checkpoint's ``quantization_config``, else its ``torch_dtype``)."""
    frontend: str | FrontendModel | None = None
    """The API server's per-request CPU work ahead of the engine (``sim/frontend.py``): a
    registered name (``sim.frontend.FRONTENDS``), a mapping of ``FrontendModel`` fields, or None
    (no frontend: a routed request joins the waiting queue at once, as before the option)."""

    def __post_init__(self) -> None:
        if self.model_config is None and (self.gpu is not None or self.tensor_parallel != 1):
            raise ConfigError("engine.gpu and engine.tensor_parallel apply to engine.model_config only; "
                              "catalog presets name them: engine.preset=<model>/<gpu>/tp<k>")
        if self.model_config is not None and self.gpu is None:
            raise ConfigError("engine.model_config needs engine.gpu; allowed: " + ", ".join(GPUS)
                              + ", or a mapping of datasheet fields (docs/hardware.md)")
        if self.gpu is not None and not isinstance(self.gpu, str):
            object.__setattr__(self, "gpu", resolve_gpu(self.gpu, "engine.gpu"))
        check_choice("engine.latency_fit", self.latency_fit, LATENCY_FITS)
        if self.latency_fit != "kernels" and self.model_config is None:
            raise ConfigError(f"engine.latency_fit={self.latency_fit!r} applies to engine.model_config presets only "
                              f"(named presets carry their own fit); allowed here: kernels")
        if self.quantization is not None:
            check_choice("engine.quantization", self.quantization, QUANTIZATIONS)
            if self.model_config is None:
                raise ConfigError("engine.quantization applies to engine.model_config presets only (named presets "
                                  "carry their own weights); allowed here: null")
        self.hardware  # validates the preset name (or the custom model on its GPU)
        check_int("engine.block_size", self.block_size, 1, MAX_CONTEXT_TOKENS)
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
        check_choice("engine.kv_allocation", self.kv_allocation, KV_ALLOCATIONS)
        if self.kv_allocation == "chunk" and not self.chunked_prefill:
            raise ConfigError("engine.kv_allocation=chunk needs engine.chunked_prefill=true (blocks are "
                              "allocated per prefill chunk); allowed without chunking: request")
        check_bool("engine.cpu_overhead", self.cpu_overhead)
        check_bool("engine.async_scheduling", self.async_scheduling)
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
        if self.frontend is not None and not isinstance(self.frontend, (str, FrontendModel)):
            object.__setattr__(self, "frontend", resolve_frontend(self.frontend))
        resolve_frontend(self.frontend)   # validates a name

    @property
    def frontend_model(self) -> FrontendModel | None:
        """The frontend's coefficients (None: no frontend)."""
        return resolve_frontend(self.frontend)

    @property
    def hardware(self) -> HardwarePreset:
        if self.model_config is not None:
            return custom_preset(str(self.model_config), self.gpu, self.tensor_parallel, self.latency_fit,
                                 self.quantization)
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


ENGINE_OPTIONS: tuple[str, ...] = tuple(f.name for f in fields(EngineConfig))


def expand_instance_groups(groups: Any, base: EngineConfig, option: str = "cluster.instances",
                           ) -> tuple[EngineConfig, ...]:
    """One ``EngineConfig`` per instance from a list of engine groups.

    A group is an ``EngineConfig`` (one instance) or a mapping of engine options plus ``count``
    (instances of that kind, default 1); options it leaves out come from ``base`` (the cluster's
    ``engine``). Errors name the group index and the field (``instances[1].count``)."""
    if isinstance(groups, (str, bytes)) or isinstance(groups, EngineConfig) or hasattr(groups, "keys") \
            or not hasattr(groups, "__iter__"):
        raise ConfigError(f"{option}={groups!r} must be a list of engine groups, e.g. "
                          "[{preset: llama2-7b-a100, count: 2}, {preset: llama2-7b-v100, count: 2}]")
    out: list[EngineConfig] = []
    for g, group in enumerate(groups):
        where = f"{option}[{g}]"
        if isinstance(group, EngineConfig):
            out.append(group)
            continue
        if not hasattr(group, "keys"):
            raise ConfigError(f"{where}={group!r} must be an engine group: a mapping of engine "
                              f"options and count; allowed keys: count, {', '.join(ENGINE_OPTIONS)}")
        opts = dict(group)
        reject_unknown(where, opts, ("count", *ENGINE_OPTIONS))
        count = opts.pop("count", 1)
        check_int(f"{where}.count", count, 1, MAX_INSTANCES)
        try:
            engine = replace(base, **opts)
        except ConfigError as exc:   # the engine's message names the field; add the group
            raise ConfigError(f"{where}: {exc}") from None
        out += [engine] * int(count)
    if not out:
        raise ConfigError(f"{option} is empty; allowed: a list of at least one engine group")
    if len(out) > MAX_INSTANCES:
        raise ConfigError(f"{option} adds up to {len(out)} instances; allowed: at most {MAX_INSTANCES}")
    return tuple(out)


def resolve_instances(num_instances: int | None, instances: Any, base: EngineConfig,
                      prefix: str = "cluster.") -> tuple[int, tuple[EngineConfig, ...] | None]:
    """(instance count, per-instance engines or None) from the two ways of sizing a cluster:
    ``num_instances`` alone (homogeneous; default 4), or ``instances`` (mixed), with
    ``num_instances`` None or equal to the instances' total."""
    if instances is None:
        m = 4 if num_instances is None else num_instances
        check_int(f"{prefix}num_instances", m, 1, MAX_INSTANCES)
        return m, None
    engines = expand_instance_groups(instances, base, f"{prefix}instances")
    if num_instances is not None:
        check_int(f"{prefix}num_instances", num_instances, 1, MAX_INSTANCES)
        if num_instances != len(engines):
            raise ConfigError(
                f"{prefix}num_instances={num_instances} and {prefix}instances ({len(engines)} "
                f"instances in {len(list(instances))} groups) disagree; give one of them (set "
                f"{prefix}num_instances=null) or the same count")
    return len(engines), engines


@dataclass(frozen=True)
class ClusterConfig:
    """The instances behind one router: ``num_instances`` copies of ``engine`` (homogeneous), or
    ``instances``, one engine config per instance (a mixed cluster, e.g. A100s and V100s)."""

    num_instances: int | None = None
    """Instances of ``engine``; None = 4, or the count of ``instances`` when that is given."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The engine of every instance (homogeneous), or the defaults of the engine groups."""
    fast: bool = True
    """Advance stretches of identical decode iterations in closed form; False = one iteration
    at a time (the reference mode the tests compare against)."""
    instances: tuple[EngineConfig, ...] | None = None
    """Engine groups of a mixed cluster (``expand_instance_groups``), stored expanded: one
    ``EngineConfig`` per instance. None: homogeneous."""

    def __post_init__(self) -> None:
        check_bool("cluster.fast", self.fast)
        if isinstance(self.engine, dict):
            object.__setattr__(self, "engine", EngineConfig(**self.engine))
        m, engines = resolve_instances(self.num_instances, self.instances, self.engine)
        object.__setattr__(self, "num_instances", m)
        object.__setattr__(self, "instances", engines)
        declared: dict[str, tuple[int, GPUDatasheet]] = {}
        for i, e in enumerate(self.engines):   # one name, one GPU: labels and tables go by name
            if isinstance(e.gpu, GPUDatasheet):
                j, other = declared.setdefault(e.gpu.name, (i, e.gpu))
                if other != e.gpu:
                    raise ConfigError(f"cluster.instances: instances {j} and {i} declare GPU "
                                      f"{e.gpu.name!r} with different figures ({other} vs {e.gpu}); "
                                      "give each declared GPU its own name")

    @property
    def engines(self) -> tuple[EngineConfig, ...]:
        """Each instance's engine config, in instance order."""
        if self.instances is None:
            return (self.engine,) * self.num_instances
        return self.instances

    @property
    def homogeneous(self) -> bool:
        """Every instance has the same engine config (a mixed list of equal groups is too)."""
        if self.instances is None:
            return True
        first = self.instances[0]
        return all(e == first for e in self.instances)

    def describe(self) -> str:
        """Instances by the preset they run, in order: ``4 x llama2-7b-v100``, ``2 x
        llama2-7b-a100 + 2 x llama2-7b-v100``, ``4 x llama2-7b/a100-80gb/tp1`` for an
        ``engine.model_config`` (run records and result headers; from the resolved hardware,
        so never the default preset's name for a run on other hardware)."""
        runs: list[list] = []
        for e in self.engines:
            if runs and runs[-1][0] == e:
                runs[-1][1] += 1
            else:
                runs.append([e, 1])
        return " + ".join(f"{n} x {e.hardware.name}" for e, n in runs)
