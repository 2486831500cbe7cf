"""Named regimes of ``LLMCluster-v0``: the settings where the project's results live, one
``gym.make`` away.

``LLMCluster-v0`` is the paper's main setting (4 x V100, 20 req/s): in this simulator that is a
load factor of about 0.58, where every heuristic is within 1-3% of round robin. The regimes
where routing matters are these presets, each registered as an id of its own (``ENV_IDS`` in
``llm_lb_gym/__init__.py``) and reachable from any id with the ``preset=`` keyword::

    gym.make("LLMCluster-NearCapacity-v0")
    gym.make("LLMCluster-v0", preset="near_capacity", num_requests=500)   # a keyword overrides

This module is the one place each regime's values are written. The Hydra experiment built on a
preset (``Preset.experiment``) takes them from here (``llm_lb_gym.experiments._hydra`` stores
each preset as the config ``/preset/<name>``; ``conf/experiment/<experiment>.yaml`` lists it in
its defaults), so ``gym.make`` and ``llm-lb-gym evaluate experiment=...`` simulate the same
cluster, traffic and reward discount (``tests/test_presets.py`` checks it episode by episode).

Two things are a newcomer's defaults, not the regime's: the predictor, ``PREDICTOR`` (the env's
deployable default, the noisy predictor at the paper's measured accuracy, calibrated, which the
Hydra entry points' default group ``conf/predictor/noisy.yaml`` mirrors; the oracle sees every
request's true output length, which no deployment has, and a newcomer's first numbers should
not rest on it: ``predictor="oracle"`` is the clairvoyant reference), and the reward, ``REWARD``
(requests in the system x seconds: the undiscounted return is minus the sum of the episode's
E2E latencies, the metric routers are compared on; the paper's slowdown-weighted reward with its
completion bonus and guidance stays ``LLMCluster-v0``'s and the paper experiments').
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

from .._validate import check_choice
from ..predictor.registry import DEFAULT_PREDICTOR

PREDICTOR: Mapping[str, Any] = DEFAULT_PREDICTOR
"""Every preset's output-length predictor: the env's default (``predictor.registry.
DEFAULT_PREDICTOR``: the true completion-time bucket with probability 0.79, the paper's DistilBERT
test accuracy, else another bucket, calibrated on the workload's history). A deployable
reference, not the oracle; it is set there, once, for the env, the presets and the settings."""

REWARD: Mapping[str, Any] = {"mode": "baseline", "penalty": "latency", "completion_reward": 0.0}
"""Every preset's reward (``conf/reward/latency.yaml``'s choice): no guidance, the latency penalty,
no completion bonus; a preset's own reward entries (its discount horizon) are added to it.
Near capacity the sign of a one-step deviation's return advantage agreed with the change in the
episode's mean E2E 30 times in 30 at a 30 s horizon (docs/reproduction.md)."""

NAMED_OPTIONS = ("workload", "predictor")
"""Options given as a name or ``{"name": ..., **options}``: a keyword with another name replaces
the preset's whole entry (its options belong to the other name), one with the same name is
merged into it."""


@dataclass(frozen=True)
class Preset:
    """One named regime: ``gym.make`` keywords (``options``, predictor aside) and what it is."""

    name: str
    """The ``preset=`` keyword's value."""
    env_id: str
    """Its registered Gymnasium id."""
    summary: str
    """One line: the cluster, the traffic and why routing matters there."""
    options: Mapping[str, Any]
    """``gym.make`` keywords of the regime, without ``predictor`` (``PREDICTOR`` is added) and with
    only the reward entries the regime needs (``REWARD`` is added beneath them)."""
    experiment: str
    """The ``conf/experiment/*.yaml`` that runs the same regime under Hydra."""
    needs_data: str | None = None
    """A registered dataset the workload reads (``python -m llm_lb_gym.data fetch NAME``)."""


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        "near_capacity", "LLMCluster-NearCapacity-v0",
        "4 x Llama-2-7B on V100 (32 GB), the five-task mix at 52 req/s: load factor ~1.5 of the "
        "measured capacity (34.7 req/s), queues build, KV fills, preemptions start",
        {"num_instances": 4, "num_requests": 2000, "arrival_rate_rps": 52.0,
         "engine": {"preset": "llama2-7b-v100"}, "workload": {"name": "task_mix"}},
        experiment="v100_near_capacity"),
    Preset(
        "overload", "LLMCluster-Overload-v0",
        "4 x Llama-2-7B on V100 (16 GB: 69 KV blocks, a 1,024-token window), the five-task mix "
        "at 20 req/s: load factor ~4.2, the paper's regime (round robin's mean E2E ~155 s)",
        {"num_instances": 4, "num_requests": 2000, "arrival_rate_rps": 20.0,
         "engine": {"preset": "llama2-7b-v100-16gb", "max_model_len": 1024},
         "workload": {"name": "task_mix"},
         # A decision's effect on latency lasts minutes here (conf/experiment/paper_v100_kv_limited.yaml says how measured).
         "reward": {"horizon_s": 120.0}},
        experiment="paper_v100_kv_limited"),
    Preset(
        "trace", "LLMCluster-Trace-v0",
        "4 x Llama-3.1-8B on A100, chunked prefill (1,024-token budget), 4,000 requests of the "
        "Azure LLM 2023 conversation trace replayed 15x faster (~80 req/s, load factor ~3.0)",
        {"num_instances": 4, "num_requests": 4000, "arrival_rate_rps": None,
         "engine": {"preset": "llama3-8b-a100", "chunked_prefill": True,
                    "max_num_batched_tokens": 1024},
         "workload": {"name": "azure_conv", "rate_scale": 15.0, "start": "random"},
         # The mixing estimator's gradients of the same preset (conf/experiment/paper_a100_llama3.yaml).
         "reward": {"mixing": {"grad1": 7.735e-5, "grad2": 7.98e-6}}},
        experiment="paper_azure_conv", needs_data="azure_conv"),
)}


def preset(name: str) -> Preset:
    """The preset ``name``; an unknown name is an error listing the known ones."""
    check_choice("preset", name, tuple(PRESETS))
    return PRESETS[name]


def preset_options(name: str) -> dict[str, Any]:
    """The ``gym.make`` keywords of preset ``name``, predictor and reward included (a fresh copy)."""
    opts = copy.deepcopy(dict(preset(name).options))
    opts["reward"] = _merge(REWARD, opts.get("reward") or {})
    return {**opts, "predictor": dict(PREDICTOR)}


def _merge(base: Mapping, over: Mapping) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_preset(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Preset ``name``'s keywords with ``options`` (the caller's) on top.

    A keyword given as a dict is merged into the preset's dict of the same option, key by key
    and recursively (``engine={"scheduler": "bin_packing"}`` keeps the preset's GPU); anything
    else replaces it (an ``EngineConfig``, a name, None for the default). ``workload`` and
    ``predictor`` merge only when they name the same thing (``NAMED_OPTIONS``). Giving
    ``instances`` (a mixed cluster) drops the preset's ``num_instances``, which would disagree.
    """
    out = preset_options(name)
    for key, value in options.items():
        mine = out.get(key)
        if isinstance(value, Mapping) and isinstance(mine, Mapping):
            if key in NAMED_OPTIONS and value.get("name", mine.get("name")) != mine.get("name"):
                out[key] = copy.deepcopy(dict(value))   # another workload/predictor: its own options
            else:
                out[key] = _merge(mine, value)
        else:
            out[key] = copy.deepcopy(value)
    if options.get("instances") is not None and "num_instances" not in options:
        out.pop("num_instances", None)
    return out
