"""Network shapes from plain config values: ``net_arch`` lists and activation names.

Hydra YAML can hold ``[64, 64]`` and ``relu`` but not ``torch.nn.ReLU``; these helpers turn the
plain values into what SB3's ``policy_kwargs`` and the custom agents need, with errors that list
the allowed names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from llm_lb_gym._validate import ConfigError, check_int, lookup

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "leaky_relu": nn.LeakyReLU,
}


def activation_class(value: str | type[nn.Module]) -> type[nn.Module]:
    """``"relu"`` -> ``nn.ReLU``; a module class passes through unchanged."""
    if isinstance(value, type) and issubclass(value, nn.Module):
        return value
    if not isinstance(value, str):
        raise ConfigError(
            f"activation={value!r} must be a name; allowed: {', '.join(sorted(ACTIVATIONS))}"
        )
    return lookup("activation", ACTIVATIONS, value.lower())


def hidden_sizes(name: str, value: Any) -> list[int]:
    """A list of positive layer widths from any sequence (tuples, OmegaConf ListConfig)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(f"{name}={value!r} must be a list of positive integers")
    sizes = list(value)
    for i, width in enumerate(sizes):
        check_int(f"{name}[{i}]", width, lo=1)
    return [int(w) for w in sizes]


def net_arch_value(value: Any) -> list[int] | dict[str, list[int]]:
    """SB3 ``net_arch``: a width list, or for actor-critic a mapping such as ``{pi: [..], vf: [..]}``."""
    if isinstance(value, Mapping):
        return {str(k): hidden_sizes(f"net_arch.{k}", v) for k, v in value.items()}
    return hidden_sizes("net_arch", value)


def mlp(in_dim: int, out_dim: int, net_arch: Sequence[int], activation: str | type[nn.Module]) -> nn.Sequential:
    """Plain MLP ``in -> hidden... -> out`` with the activation between layers, none at the end."""
    act = activation_class(activation)
    layers: list[nn.Module] = []
    last = in_dim
    for width in hidden_sizes("net_arch", net_arch):
        layers += [nn.Linear(last, width), act()]
        last = width
    layers.append(nn.Linear(last, out_dim))
    return nn.Sequential(*layers)
