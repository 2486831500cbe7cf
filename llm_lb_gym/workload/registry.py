"""Workloads and arrival processes by name, for ``gym.make`` keywords and Hydra configs.

``make_workload("task_mix", rate_rps=40.0)`` or ``make_workload("azure_conv", rate_scale=2.0)``.
Every request trace registered in ``data.DATASETS`` is a workload of the same name (its file is
found and checked by ``data.locate``; ``path=`` replays a file of your own in its place);
``trace`` (any ``format``), ``mooncake`` and ``burstgpt`` replay a file you name with ``path``.
Every name accepts the arrival options ``arrival`` (a kind from ``ARRIVAL_KINDS``),
``rate_rps`` and ``cv``, or ``arrivals`` (an arrival-process object, or a dict with ``kind``)
instead; for a timestamped trace, giving any of them replaces its recorded arrival times.
``uses_synthetic_arrivals(name, options)`` says which workloads draw arrivals from a process
(the env's ``arrival_rate_rps`` then drives them). Unknown names and options raise ConfigError
listing the valid ones.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Mapping

from .._validate import ConfigError, check_choice, check_range, lookup, reject_unknown
from ..data.formats import TRACE_FORMATS
from ..data.registry import trace_datasets
from ..data.store import locate
from ..limits import MIN_RATE_RPS
from .arrivals import ArrivalProcess, DeterministicArrivals, GammaArrivals, PoissonArrivals
from .base import Workload
from .task_mix import TaskMixWorkload
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
                  "tasks", "length_scale")
_TRACE_KEYS = ("path", "rate_scale", "start", "max_prompt_tokens", "max_context_tokens",
               "zero_tokens", "task_name", "split", "test_fraction")
_ARRIVAL_OPTION_NAMES = _ARRIVAL_KEYS + ("arrivals",)


@dataclass(frozen=True)
class _Generated:
    """A workload that makes its own requests (no timestamps): arrivals always synthetic."""

    build: Callable[..., Workload]

    def __call__(self, **options) -> Workload:
        return self.build(**options)

    def replays_timestamps(self, options: Mapping) -> bool:
        return False


def _task_mix(**options) -> Workload:
    reject_unknown("task_mix", options, _TASK_MIX_KEYS + _ARRIVAL_OPTION_NAMES)
    arrivals = _pop_arrivals(options, PoissonArrivals(DEFAULT_RATE_RPS))
    return TaskMixWorkload(arrivals=arrivals, **options)


@dataclass(frozen=True)
class _Trace:
    """A trace workload: a registered dataset (``dataset``), or a file the caller names with
    ``path`` in a fixed ``format`` (or in any format given as an option, when ``format`` is None)."""

    name: str
    format: str | None
    dataset: str | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        return _TRACE_KEYS + _ARRIVAL_OPTION_NAMES + (("format",) if self.format is None else ())

    def _format(self, options: Mapping) -> str | None:
        return options.get("format", self.format)

    def replays_timestamps(self, options: Mapping) -> bool:
        """Whether it replays recorded times (False: its format has none); a format still to
        be given counts as timestamped."""
        fmt = self._format(options)
        return fmt not in TRACE_FORMATS or TRACE_FORMATS[fmt].has_timestamps

    def __call__(self, **options) -> Workload:
        reject_unknown(self.name, options, self.keys)
        fmt = options.pop("format", self.format)
        if fmt is None:
            raise ConfigError(f"{self.name} needs format=...; allowed: {', '.join(TRACE_FORMATS)}")
        check_choice("format", fmt, TRACE_FORMATS)
        path = options.pop("path", None)
        if path is None and self.dataset is None:
            raise ConfigError(f"{self.name} needs path=... (the trace file to replay)")
        if "rate_scale" in options:   # option errors before a missing data file's message
            check_range("rate_scale", options["rate_scale"], MIN_RATE_RPS)
        file = locate(self.dataset) if path is None else path
        default = None if TRACE_FORMATS[fmt].has_timestamps else PoissonArrivals(DEFAULT_RATE_RPS)
        arrivals = _pop_arrivals(options, default)
        if self.dataset is not None and TRACE_FORMATS[fmt].task_column is None:
            options.setdefault("task_name", self.name)
        return TraceWorkload(path=str(file), format=fmt, arrivals=arrivals,
                             dataset=self.dataset if path is None else None, **options)


_CONVERSATION_KEYS = ("num_system_prompts", "system_prompt_tokens", "turns_per_conversation",
                      "user_message_tokens", "response_tokens", "length_log_sigma", "think_time_s",
                      "max_context_tokens", "hash_block_tokens")


def _conversation(**options) -> Workload:
    """Multi-turn conversations behind shared system prompts, with prefix hash ids."""
    from .conversation import ConversationWorkload

    reject_unknown("conversation", options, _CONVERSATION_KEYS + _ARRIVAL_OPTION_NAMES)
    arrivals = _pop_arrivals(options, PoissonArrivals(DEFAULT_RATE_RPS))
    return ConversationWorkload(arrivals=arrivals, **options)


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


WORKLOADS: dict[str, _Generated | _Trace] = {
    "corpus": _Generated(_corpus),
    "task_mix": _Generated(_task_mix),
    "conversation": _Generated(_conversation),
    **{name: _Trace(name, ds.format, name) for name, ds in trace_datasets().items()},
    "mooncake": _Trace("mooncake", "mooncake"),
    "burstgpt": _Trace("burstgpt", "burstgpt"),
    "trace": _Trace("trace", None),
}
"""Names accepted by ``make_workload``: the generated workloads, every registered trace
(``data.DATASETS``, found under the data directories) and the readers of your own files."""


def make_workload(name: str, **options) -> Workload:
    """Build the workload ``name`` with ``options`` (validated; errors list what is allowed)."""
    return lookup("workload", WORKLOADS, name)(**options)


def uses_synthetic_arrivals(name: str, options: Mapping | None = None) -> bool:
    """True when workload ``name`` (with ``options``, which may choose a trace's ``format``)
    has no timestamps of its own, so its arrivals come from an arrival process: the generated
    workloads and length-only traces. (Any workload takes arrival options that override.)"""
    return not lookup("workload", WORKLOADS, name).replays_timestamps(dict(options or {}))


def synthetic_arrival_workloads() -> tuple[str, ...]:
    """Workload names whose arrivals are synthetic with their default options."""
    return tuple(n for n in WORKLOADS if uses_synthetic_arrivals(n))
