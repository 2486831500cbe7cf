"""Workloads and arrival processes by name, for ``gym.make`` keywords and Hydra configs.

``make_workload("task_mix", rate_rps=40.0)`` or ``make_workload("azure_conv", rate_scale=2.0)``.
Every name accepts the arrival options ``arrival`` (a kind from ``ARRIVAL_KINDS``),
``rate_rps`` and ``cv``, or ``arrivals`` (an arrival-process object, or a dict with ``kind``)
instead; for a timestamped trace, giving any of them replaces its recorded arrival times.
Unknown names and options raise ConfigError listing the valid ones.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Callable, Mapping

from .._validate import ConfigError, lookup, reject_unknown
from .arrivals import ArrivalProcess, DeterministicArrivals, GammaArrivals, PoissonArrivals
from .base import Workload
from .data_dir import resolve_data_file
from .task_mix import TaskMixWorkload
from .trace_readers import TRACE_FORMATS
from .trace_workload import TraceWorkload

DEFAULT_RATE_RPS = 20.0
"""Rate of the default Poisson arrivals (the paper's V100 setting)."""

ARRIVAL_KINDS: dict[str, type] = {
    "poisson": PoissonArrivals,
    "gamma": GammaArrivals,
    "deterministic": DeterministicArrivals,
}
_ARRIVAL_KEYS = ("arrival", "rate_rps", "cv")


def arrival_process(kind: str = "poisson", **options) -> ArrivalProcess:
    """An arrival process by kind: poisson(rate_rps), gamma(rate_rps, cv), deterministic(rate_rps)."""
    cls = lookup("arrival process", ARRIVAL_KINDS, kind)
    reject_unknown(f"{kind} arrival", options, [f.name for f in fields(cls)])
    return cls(**options)


def _pop_arrivals(options: dict, default: ArrivalProcess | None) -> ArrivalProcess | None:
    """Remove the arrival options from ``options`` and build the process they describe."""
    given = {k: options.pop(k) for k in _ARRIVAL_KEYS if k in options}
    if "arrivals" in options:
        arrivals = options.pop("arrivals")
        if given:
            raise ConfigError(f"give either arrivals or {', '.join(sorted(given))}, not both")
        if isinstance(arrivals, Mapping):
            spec = dict(arrivals)
            return arrival_process(spec.pop("kind", "poisson"), **spec)
        if arrivals is not None and not hasattr(arrivals, "times_s"):
            raise ConfigError(f"arrivals={arrivals!r} must be an arrival process, a dict with "
                              f"'kind' (allowed: {', '.join(ARRIVAL_KINDS)}), or None")
        return arrivals
    if not given:
        return default
    kind = given.pop("arrival", "poisson")
    given.setdefault("rate_rps", DEFAULT_RATE_RPS)
    return arrival_process(kind, **given)


_TASK_MIX_KEYS = ("weights", "max_prompt_tokens", "max_context_tokens", "heavy_decode_tokens",
                  "tasks")
_TRACE_KEYS = ("path", "rate_scale", "start", "max_prompt_tokens", "max_context_tokens",
               "zero_tokens", "task_name")
_ARRIVAL_OPTION_NAMES = _ARRIVAL_KEYS + ("arrivals",)


def _task_mix(**options) -> Workload:
    reject_unknown("task_mix", options, _TASK_MIX_KEYS + _ARRIVAL_OPTION_NAMES)
    arrivals = _pop_arrivals(options, PoissonArrivals(DEFAULT_RATE_RPS))
    return TaskMixWorkload(arrivals=arrivals, **options)


def _trace_factory(name: str, format: str | None, default_file: str | None) -> Callable[..., Workload]:
    """Builder for a trace workload; ``format``/``default_file`` None means the caller gives them."""
    keys = _TRACE_KEYS + _ARRIVAL_OPTION_NAMES + (("format",) if format is None else ())

    def build(**options) -> Workload:
        reject_unknown(name, options, keys)
        fmt = options.pop("format", format)
        if fmt is None:
            raise ConfigError(f"{name} needs format=...; allowed: {', '.join(TRACE_FORMATS)}")
        path = options.pop("path", None)
        if path is None and default_file is None:
            raise ConfigError(f"{name} needs path=... (the trace file to replay)")
        path = resolve_data_file(default_file or "", path)
        default = PoissonArrivals(DEFAULT_RATE_RPS) if fmt == "lengths" else None
        arrivals = _pop_arrivals(options, default)
        if default_file is not None:
            options.setdefault("task_name", name)
        return TraceWorkload(path=str(path), format=fmt, arrivals=arrivals, **options)

    build.__doc__ = f"Trace workload {name!r} (format {format or 'given'})."
    return build


_CORPUS_KEYS = ("path", "task_filter", "split", "test_fraction", "max_prompt_tokens",
                "max_context_tokens")


def _corpus(**options) -> Workload:
    """Requests drawn from a prompts-with-responses corpus (real prompt texts, for the
    transformer predictor); arrivals synthetic like the task mix."""
    from .corpus import CorpusWorkload

    reject_unknown("corpus", options, _CORPUS_KEYS + _ARRIVAL_OPTION_NAMES)
    arrivals = _pop_arrivals(options, PoissonArrivals(DEFAULT_RATE_RPS))
    if options.get("task_filter") is not None:
        options["task_filter"] = tuple(options["task_filter"])
    return CorpusWorkload(arrivals=arrivals, **options)


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "corpus": _corpus,
    "task_mix": _task_mix,
    "azure_conv": _trace_factory("azure_conv", "azure", "traces/azure_llm_2023_conv.csv"),
    "sharegpt": _trace_factory("sharegpt", "lengths",
                               "traces/sharegpt_lengths_llama2_tokenizer.csv"),
    "arxiv_summarization": _trace_factory(
        "arxiv_summarization", "lengths",
        "traces/arxiv_summarization_lengths_llama2_tokenizer.csv"),
    "mooncake": _trace_factory("mooncake", "mooncake", None),
    "burstgpt": _trace_factory("burstgpt", "burstgpt", None),
    "trace": _trace_factory("trace", None, None),
}
"""Names accepted by ``make_workload``; the shipped traces resolve under the data directory."""


def make_workload(name: str, **options) -> Workload:
    """Build the workload ``name`` with ``options`` (validated; errors list what is allowed)."""
    return lookup("workload", WORKLOADS, name)(**options)
