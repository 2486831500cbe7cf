"""GPU datasheets: what a roofline latency model and vLLM's memory profile need of a GPU.

Why: presets for GPUs nobody profiled are built from the datasheet peaks times efficiency factors
calibrated on the profiled ones (A100, H100, A40; ``roofline.py``). Peaks are NVIDIA's dense
(no-sparsity) FP16/BF16 tensor-core figures; bandwidths are per direction.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any, Mapping

from .._validate import ConfigError, check_choice, check_range, lookup

GIB = 1024 ** 3
INTERCONNECTS = ("nvlink", "pcie")


@dataclass(frozen=True)
class GPUDatasheet:
    """Peak figures of one GPU model."""

    name: str
    memory_bytes: float
    """Total device memory as CUDA reports it (``torch.cuda.mem_get_info``'s total, what vLLM
    multiplies by ``gpu_memory_utilization``): a little below the marketed capacity."""
    memory_bandwidth_bytes_s: float
    fp16_flops: float
    """Dense FP16/BF16 tensor-core peak, FLOP/s (half the datasheet's "with sparsity" figure)."""
    interconnect_bytes_s: float
    """GPU-to-GPU bandwidth per direction used by a tensor-parallel all-reduce."""
    interconnect: str
    """``nvlink`` (NVLink/NVSwitch) or ``pcie``."""
    fp8_flops: float = 0.0
    """Dense FP8 tensor-core peak, FLOP/s; 0 = no FP8 tensor cores (Volta, Ampere), where vLLM
    serves FP8 weights with weight-only kernels at the FP16 rate (``architecture.quantization``)."""

    def __post_init__(self) -> None:
        for f in ("memory_bytes", "memory_bandwidth_bytes_s", "fp16_flops", "interconnect_bytes_s"):
            check_range(f"gpu.{f}", getattr(self, f), 0.0, lo_open=True)
        check_range("gpu.fp8_flops", self.fp8_flops, 0.0)
        check_choice("gpu.interconnect", self.interconnect, INTERCONNECTS)


GB = 1e9
TFLOPS = 1e12
MIB = 1024 ** 2

GPUS: dict[str, GPUDatasheet] = {g.name: g for g in (
    # V100 SXM2 (NVIDIA V100 datasheet): 900 GB/s HBM2, 125 TFLOPS tensor, NVLink 2.0 300 GB/s
    # total = 150 GB/s per direction. 16 GB: 15.77 GiB reported (PyTorch OOM messages on Azure
    # NC*s_v3); 32 GB: 31.74 GiB.
    GPUDatasheet("v100-16gb", 15.77 * GIB, 900 * GB, 125 * TFLOPS, 150 * GB, "nvlink"),
    GPUDatasheet("v100-32gb", 31.74 * GIB, 900 * GB, 125 * TFLOPS, 150 * GB, "nvlink"),
    # A10G (AWS G5; the A10's memory, lower tensor clocks): 24 GB GDDR6 at 600 GB/s, ~70 TFLOPS
    # dense FP16 tensor (Baseten, "NVIDIA A10 vs A10G for ML model inference"); PCIe Gen4 x16
    # 32 GB/s per direction; nvidia-smi reports 23,028 MiB.
    GPUDatasheet("a10g", 23028 * MIB, 600 * GB, 70 * TFLOPS, 32 * GB, "pcie"),
    # L4 (NVIDIA L4 datasheet): 24 GB GDDR6 at 300 GB/s, 242 TFLOPS FP16 with sparsity = 121 dense,
    # 485 FP8 with sparsity = 242.5 dense; PCIe Gen4 x16; nvidia-smi reports 23,034 MiB.
    GPUDatasheet("l4", 23034 * MIB, 300 * GB, 121 * TFLOPS, 32 * GB, "pcie", fp8_flops=242.5 * TFLOPS),
    # A40 (NVIDIA A40 datasheet; profiled by Vidur): 48 GB GDDR6 at 696 GB/s, 149.7 TFLOPS FP16
    # tensor; NVLink bridge only pairs GPUs (112.5 GB/s bidirectional), so PCIe Gen4 for the
    # all-reduce; 44.35 GiB reported (PyTorch OOM message, NVIDIA/TensorRT-LLM#67).
    GPUDatasheet("a40", 44.35 * GIB, 696 * GB, 149.7 * TFLOPS, 32 * GB, "pcie"),
    # A100 SXM4 (NVIDIA A100 datasheet): 40 GB at 1,555 GB/s, 80 GB at 2,039 GB/s; 312 TFLOPS
    # FP16 tensor; NVLink 3 600 GB/s total = 300 per direction. Reported 39.39 / 79.15 GiB.
    GPUDatasheet("a100-40gb", 39.39 * GIB, 1555 * GB, 312 * TFLOPS, 300 * GB, "nvlink"),
    GPUDatasheet("a100-80gb", 79.15 * GIB, 2039 * GB, 312 * TFLOPS, 300 * GB, "nvlink"),
    # H100 SXM5 (NVIDIA H100 datasheet): 80 GB HBM3 at 3.35 TB/s, 1,979 TFLOPS FP16 with sparsity
    # = 989.4 dense, 3,958 FP8 with sparsity = 1,979 dense; NVLink 4 900 GB/s total = 450 per
    # direction; 79.22 GiB reported (vLLM's memory-profiling log, vllm-project/vllm#12126).
    GPUDatasheet("h100-80gb", 79.22 * GIB, 3352 * GB, 989.4 * TFLOPS, 450 * GB, "nvlink", fp8_flops=1979 * TFLOPS),
)}

PROFILED_GPUS = {"a100": "a100-80gb", "h100": "h100-80gb", "a40": "a40"}
"""Vidur's profiled devices (``shared/data/profiling/vidur/compute/<device>``) -> datasheet."""


def get_gpu(name: str) -> GPUDatasheet:
    """Datasheet by name; the error lists the valid names."""
    return lookup("gpu", GPUS, name)


def declare_gpu(spec: Mapping[str, Any], where: str = "engine.gpu") -> GPUDatasheet:
    """A GPU that is not in ``GPUS``, declared by its datasheet fields (a mapping with every
    field of :class:`GPUDatasheet`), e.g. in YAML::

        engine:
          model_config: llama2-7b          # a built-in architecture or a config.json path
          gpu: {name: a30, memory_bytes: 25.2e9, memory_bandwidth_bytes_s: 933e9,
                fp16_flops: 165e12, interconnect_bytes_s: 32e9, interconnect: pcie}

    Errors name ``where.<field>`` and the allowed values. A declared GPU may reuse a built-in
    name only with the built-in's figures (otherwise two GPUs would answer to one name)."""
    names = [f.name for f in fields(GPUDatasheet)]
    unknown = sorted(str(k) for k in spec if k not in names)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(names)}")
    optional = {f.name for f in fields(GPUDatasheet) if f.default is not MISSING}
    missing = [n for n in names if n not in spec and n not in optional]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}; a declared GPU needs all of "
                          f"{', '.join(n for n in names if n not in optional)} (optional: {', '.join(sorted(optional))}; "
                          f"or name a built-in GPU: {', '.join(GPUS)})")
    name = spec["name"]
    if not isinstance(name, str) or not name or "/" in name:
        raise ConfigError(f"{where}.name={name!r} must be a non-empty string without '/'")
    values: dict[str, Any] = {"name": name, "interconnect": spec["interconnect"]}
    for n in names:
        if n in values or n not in spec:
            continue
        v = spec[n]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{where}.{n}={v!r} must be a {'number >= 0' if n in optional else 'positive number'}")
        values[n] = float(v)
    try:
        gpu = GPUDatasheet(**values)
    except ConfigError as exc:    # the datasheet names its fields gpu.<field>
        raise ConfigError(str(exc).replace("gpu.", f"{where}.", 1)) from None
    if name in GPUS and GPUS[name] != gpu:
        raise ConfigError(f"{where}.name={name!r} is a built-in GPU with other figures ({GPUS[name]}); "
                          "give the declared GPU its own name")
    return gpu


def resolve_gpu(gpu: str | GPUDatasheet | Mapping[str, Any], where: str = "engine.gpu") -> GPUDatasheet:
    """A built-in GPU by name, a datasheet as is, or a declared one (:func:`declare_gpu`)."""
    if isinstance(gpu, GPUDatasheet):
        return gpu
    if isinstance(gpu, str):
        return get_gpu(gpu)
    if isinstance(gpu, Mapping):
        return declare_gpu(gpu, where)
    raise ConfigError(f"{where}={gpu!r} must be a GPU name ({', '.join(GPUS)}) or a mapping of "
                      "datasheet fields")
