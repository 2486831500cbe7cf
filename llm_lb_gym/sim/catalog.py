"""The generated preset catalog: every shipped (model, GPU, tensor-parallel degree) that fits.

Why: a router study should be able to pick ``llama2-70b/h100-80gb/tp4`` or ``mistral-7b/l4/tp1``
by name. Each catalog preset derives its latency coefficients from the architecture and the GPU's
datasheet (``roofline.py``) and its KV cache from memory as vLLM computes it (``memory.py``).
Names: ``<model>/<gpu>/tp<k>`` for the architectures of ``architecture.ARCHITECTURES`` and the
GPUs of ``gpus.GPUS``. A combination is shipped when vLLM's tensor-parallel sharding allows it and
the KV cache holds at least one context window at the defaults (utilization 0.9, block 16,
``max_num_seqs`` 128, token budget max(context, 2048)); e.g. 70B needs 2+ 80 GB GPUs.

Also here: ``llama2-7b-v100-16gb`` (the paper's V100 latency coefficients, 16 GB of memory) and
:func:`custom_preset` for any ``config.json`` (``engine.model_config``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from .._validate import ConfigError
from .architecture import ARCHITECTURES, ModelArchitecture, from_hf_config
from .gpus import GPUS, GPUDatasheet, resolve_gpu
from .latency import (DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_NUM_SEQS, PRESETS,  # noqa: F401 (re-exported)
                      HardwarePreset, register_preset)
from .roofline import derive_fields, serving_fields, to_latency_model

TENSOR_PARALLEL = (1, 2, 4, 8)

_ROOFLINE_SOURCE = ("roofline from the architecture and the GPU datasheet (llm_lb_gym/sim/roofline.py) "
                    "with efficiency factors fitted on Vidur's A100/H100/A40 profiles by "
                    "experiments/calibrate_hardware.py; KV cache as vLLM's memory profile computes it "
                    "(llm_lb_gym/sim/memory.py); docs/hardware.md")


@dataclass(frozen=True)
class ArchitecturePreset(HardwarePreset):
    """A preset whose latency coefficients come from the roofline (memory as every preset's)."""

    contract: tuple[tuple[str, float], ...] = ()
    """The nine iteration-time coefficients of the latency contract (empty when the latency
    coefficients come from elsewhere)."""

    @property
    def contract_fields(self) -> dict[str, float]:
        return dict(self.contract)


def preset_name(model: str, gpu: str, tp: int) -> str:
    return f"{model}/{gpu}/tp{tp}"


LATENCY_FITS = ("kernels", "serving")
"""``engine.latency_fit``: the roofline's factors as fitted to Vidur's kernel profiles (every
preset before issue 33), or those fitted per GPU to real serving runs (``roofline.SERVING_SCALES``)."""
_SERVING_SOURCE = ("roofline from the architecture and the GPU datasheet (llm_lb_gym/sim/roofline.py) with the "
                   "per-GPU serving factors fitted to real end-to-end vLLM runs (llm_lb_gym/calibration/serving.py, "
                   "corpus.json); KV cache as vLLM's memory profile computes it; docs/calibration.md")


def build_preset(arch: ModelArchitecture, gpu: GPUDatasheet, tp: int, name: str | None = None,
                 source: str = _ROOFLINE_SOURCE, fit: str = "kernels") -> ArchitecturePreset:
    """The roofline preset of ``arch`` on ``tp`` GPUs of kind ``gpu`` (no memory check)."""
    if fit == "serving":
        fields, source = serving_fields(arch, gpu, tp), _SERVING_SOURCE
    else:
        fields = derive_fields(arch, gpu, tp)
    return ArchitecturePreset(
        name=name or preset_name(arch.name, gpu.name, tp), model=arch.name, gpu=gpu.name,
        latency=to_latency_model(fields), source=source, architecture=arch, datasheet=gpu,
        tensor_parallel=tp, contract=tuple(fields.items()))


def fits(preset: ArchitecturePreset) -> bool:
    """Whether the KV cache holds one full context window at the catalog defaults."""
    try:
        blocks = preset.num_kv_blocks(16, 0.9)
    except ConfigError:
        return False
    return blocks * 16 >= preset.model_spec.max_model_len


def catalog() -> list[ArchitecturePreset]:
    """Every shipped (model, GPU, tp) whose sharding is valid and that fits in memory."""
    out = []
    for arch in ARCHITECTURES.values():
        for gpu in GPUS.values():
            for tp in TENSOR_PARALLEL:
                try:
                    arch.check_tensor_parallel(tp)
                except ConfigError:
                    continue
                preset = build_preset(arch, gpu, tp)
                if fits(preset):
                    out.append(preset)
    return out


def v100_16gb_preset() -> HardwarePreset:
    """Llama-2-7B on a 16 GB V100: the current llama2-7b-v100 latency coefficients (derived from the
    paper's anchors, see docs/calibration.md) and the KV cache from the memory model."""
    base = PRESETS["llama2-7b-v100"]
    return HardwarePreset(
        name="llama2-7b-v100-16gb", model="llama2-7b", gpu="v100-16gb", latency=base.latency,
        source=(f"latency: the llama2-7b-v100 preset's coefficients ({base.source}); KV cache from "
                "memory as vLLM computes it, V100 SXM2 16 GB (llm_lb_gym/sim/memory.py, "
                "experiments/calibrate_hardware.py, docs/hardware.md)"),
        architecture=ARCHITECTURES["llama2-7b"], datasheet=GPUS["v100-16gb"], tensor_parallel=1)


def register_catalog() -> None:
    """Register the catalog and the 16 GB V100 preset into ``latency.PRESETS`` (idempotent)."""
    for preset in catalog() + [v100_16gb_preset()]:
        register_preset(preset)


@lru_cache(maxsize=32)
def custom_preset(model_config: str, gpu: str | GPUDatasheet, tensor_parallel: int = 1,
                  fit: str = "kernels", quantization: str | None = None) -> ArchitecturePreset:
    """A roofline preset for a built-in architecture name (``architecture.ARCHITECTURES``) or any
    Hugging Face ``config.json`` (a path or its folder), on a built-in GPU (by name) or a
    declared one (``gpus.declare_gpu``).

    Cached: an engine config asks for its preset often, and the file should be read once.
    """
    arch = ARCHITECTURES[model_config] if model_config in ARCHITECTURES else from_hf_config(model_config)
    if quantization is not None:   # the server's --quantization over the checkpoint's own
        arch = replace(arch, quantization=quantization)
    sheet = resolve_gpu(gpu)
    suffix = f"/{arch.quantization}" if arch.quantization else ""
    return build_preset(arch, sheet, tensor_parallel, name=f"{model_config}/{sheet.name}/tp{tensor_parallel}{suffix}",
                        fit=fit)
