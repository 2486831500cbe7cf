"""KV-cache size of one instance, as vLLM's memory profile derives it.

vLLM (``Worker.determine_num_available_blocks``) loads the weights, runs one forward pass of the
largest batch the scheduler may form (``max_num_batched_tokens`` tokens split over
``max_num_seqs`` sequences), and gives the KV cache what is left of
``total memory x gpu_memory_utilization`` after the weights, that pass's activation peak and the
memory outside PyTorch's allocator (CUDA context, cuBLAS workspace, NCCL buffers):

    blocks = (memory x utilization - weights/tp - activation peak - non-torch) // (KV bytes per
             token per GPU x block_size)

The activation peak is estimated from the architecture (:func:`activation_peak_bytes`); the
non-torch reserve is calibrated on vLLM's published block counts (see ``NON_TORCH_BYTES``).
"""

from __future__ import annotations

from .._validate import ConfigError
from .architecture import ModelArchitecture
from .gpus import GIB, GPUDatasheet

NON_TORCH_BYTES = 0.9396 * GIB
"""CUDA context, cuBLAS workspace and allocator slack outside the activation estimate, per GPU.
Calibrated so that Llama-2-7B on one A100-80GB at vLLM's defaults gives the 7,351 blocks vLLM
reported after its profiling fix (vllm-project/vllm#2031); ``python -m
llm_lb_gym.experiments.calibrate_hardware`` prints the check against that and vllm-project/vllm#10511."""
NCCL_BYTES = 1.79 * GIB
"""Extra non-torch memory per GPU at tensor parallel > 1 (NCCL buffers): vLLM's log for
Llama-3-8B shows non_torch_memory 1.79 GiB at tp 1 and 3.58 GiB at tp 2 (vllm-project/vllm#10511)."""
SAMPLER_FLOAT32_COPIES = 2
"""The sampler's float32 copies of the logits (probabilities and log-probabilities)."""


def activation_peak_bytes(arch: ModelArchitecture, tp: int, max_num_batched_tokens: int,
                          max_num_seqs: int) -> float:
    """Peak activation memory of the profiling forward pass on one GPU.

    Largest of: one layer's MLP (hidden state and residual, gate+up output, SiLU-and-mul output),
    one layer's attention (hidden and residual, q/k/v output, attention output), and the logits
    of the ``min(max_num_seqs, tokens)`` sequences (vocabulary-wide, in dtype plus the sampler's
    float32 copies). Layers run one after the other, so one layer's intermediates is the peak.
    """
    n, db, h = max_num_batched_tokens, arch.dtype_bytes, arch.hidden_size
    resident = 2 * n * h * db
    width = (3 if arch.gated_mlp else 2) * arch.intermediate_size / tp
    mlp = resident + n * width * db
    kv = arch.kv_heads_per_rank(tp) * arch.head_dim
    attention = resident + n * (2 * arch.q_size / tp + 2 * kv) * db
    logits = min(max_num_seqs, n) * arch.vocab_size * (db + 4 * SAMPLER_FLOAT32_COPIES)
    return max(mlp, attention, resident + logits)


def kv_bytes_per_token_per_gpu(arch: ModelArchitecture, tp: int) -> int:
    return 2 * arch.num_layers * arch.kv_heads_per_rank(tp) * arch.head_dim * arch.dtype_bytes


def num_kv_blocks(arch: ModelArchitecture, gpu: GPUDatasheet, tp: int, *, block_size: int,
                  gpu_memory_utilization: float, max_num_batched_tokens: int, max_num_seqs: int,
                  what: str = "preset") -> int:
    """KV blocks per instance (each of the ``tp`` GPUs holds its share of every block).

    Raises ConfigError naming ``what`` and the options to change when nothing is left.
    """
    weights = arch.weight_bytes / tp
    activations = activation_peak_bytes(arch, tp, max_num_batched_tokens, max_num_seqs)
    reserve = NON_TORCH_BYTES + (NCCL_BYTES if tp > 1 else 0.0)
    free = gpu.memory_bytes * gpu_memory_utilization - weights - activations - reserve
    blocks = int(free // (kv_bytes_per_token_per_gpu(arch, tp) * block_size))
    if blocks < 1:
        raise ConfigError(
            f"{what}: no GPU memory left for the KV cache: {gpu.name} x {tp} at "
            f"engine.gpu_memory_utilization={gpu_memory_utilization} gives {gpu.memory_bytes * gpu_memory_utilization / GIB:.1f} GiB "
            f"per GPU, weights take {weights / GIB:.1f} GiB, activations of "
            f"engine.max_num_batched_tokens={max_num_batched_tokens} {activations / GIB:.2f} GiB, "
            f"reserve {reserve / GIB:.2f} GiB; use more GPUs (tensor parallel), a larger GPU, a higher "
            f"gpu_memory_utilization or a smaller max_num_batched_tokens")
    return blocks
