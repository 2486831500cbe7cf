"""Latency SLOs: per-request TTFT and TBT deadlines, and whether each request met them.

Definitions (the same in the engine's running count, the episode metrics and the env reward):

- TTFT = first_token_s - arrival_s (router wait, instance queue and the prefill).
- TBT  = (finish_s - first_token_s) / (decode_tokens - 1): the mean time per output token after
  the first. Not a per-token p99: the engine advances stretches of identical decode iterations
  in closed form, so individual inter-token gaps exist only implicitly and recording them would
  cost a per-token loop in the hot path. A one-token request has no TBT and meets any TBT
  deadline.
- A request *meets its SLO* when it finished with TTFT <= its TTFT deadline and TBT <= its TBT
  deadline (both inclusive). A rejected request, and one still unfinished when an episode is cut
  at its step limit, count as missing it (also for the TTFT-only and TBT-only attainment).

Deadlines are set per request when the episode is drawn, from one of two bases per kind:

- ``ttft_s`` / ``tbt_s``: an absolute deadline, one value for the whole workload or one per task
  (keyed by the workload's task names);
- ``ttft_multiple`` / ``tbt_multiple``: a multiple of the request's isolated latency on the
  fastest instance type: for TTFT what it waits alone on an idle instance until the engine makes
  its first token (``isolated_ttft_s``: its prefill, plus, behind an API server's frontend
  (``engine.frontend``), the frontend's delay and input work, which the TTFT measured here
  includes), for TBT its isolated decode step (one decode iteration of it alone at context
  prompt + 1, ``isolated_decode_step_s``); under ``engine.async_scheduling`` each iteration the
  longer of its GPU side and CPU step, as the engine runs it. One multiple, or one per task.

Routers read the deadlines (``table.ttft_deadline_s``, ``tbt_deadline_s``), so no deadline
depends on the true output length (which routers must not see).

The default (``SLOConfig()``) is 5x isolated for both, the scale at which Splitwise (Patel et al.
2024) sets its P99 latency SLOs and DistServe (Zhong et al. 2024) reports attainment curves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np

from .._validate import ConfigError, check_range, reject_unknown

DEADLINE_KINDS = ("ttft", "tbt")


def _check_value(name: str, value: Any) -> Any:
    """One positive finite number, or a mapping task name -> positive finite number."""
    if isinstance(value, Mapping) or hasattr(value, "keys"):
        out = {}
        for k, v in dict(value).items():
            if not isinstance(k, str):
                raise ConfigError(f"{name} keys must be task names (strings); got {k!r}")
            check_range(f"{name}[{k}]", v, 0.0, lo_open=True)
            out[k] = float(v)
        if not out:
            raise ConfigError(f"{name}={{}} is empty; allowed: a number > 0, a mapping task -> "
                              "number > 0, or null")
        return out
    check_range(name, value, 0.0, lo_open=True)
    return float(value)


@dataclass(frozen=True)
class Deadline:
    """One kind of deadline, resolved: its basis (``seconds`` or ``multiple``) and its value,
    one number or {task name: number}."""

    kind: str
    basis: str
    value: float | dict

    def per_task(self, task_names: tuple[str, ...]) -> np.ndarray:
        """The value of each task, indexed like ``task_names``; a mapping must name every task
        of the workload and nothing else (errors name the option and the workload's tasks)."""
        if not isinstance(self.value, dict):
            return np.full(len(task_names), self.value, np.float64)
        opt = f"slo.{self.kind}_{'s' if self.basis == 'seconds' else 'multiple'}"
        unknown = [t for t in self.value if t not in task_names]
        if unknown:
            raise ConfigError(f"{opt} names unknown task(s) {', '.join(unknown)}; allowed: the "
                              f"workload's tasks {', '.join(task_names)}")
        missing = [t for t in task_names if t not in self.value]
        if missing:
            raise ConfigError(f"{opt} has no value for task(s) {', '.join(missing)}; it must name "
                              f"every task of the workload: {', '.join(task_names)}")
        return np.array([self.value[t] for t in task_names], np.float64)


@dataclass(frozen=True)
class SLOConfig:
    """Per-request latency deadlines (the env's ``slo=None``: none, and no SLO metrics). Per
    kind give at most one of ``<kind>_s`` and ``<kind>_multiple`` (set the other to None); a
    kind with neither has no deadline. Each value is one number or {task name: number}."""

    ttft_s: Any = None
    """Absolute time-to-first-token deadline in seconds."""
    ttft_multiple: Any = 5.0
    """TTFT deadline as a multiple of the request's isolated prefill time."""
    tbt_s: Any = None
    """Absolute deadline on the mean time between tokens, in seconds."""
    tbt_multiple: Any = 5.0
    """TBT deadline as a multiple of the request's isolated decode step (``isolated_decode_step_s``)."""

    def __post_init__(self) -> None:
        for name in ("ttft_s", "ttft_multiple", "tbt_s", "tbt_multiple"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _check_value(f"slo.{name}", value))
        for kind in DEADLINE_KINDS:
            s, x = getattr(self, f"{kind}_s"), getattr(self, f"{kind}_multiple")
            if s is not None and x is not None:
                raise ConfigError(f"slo.{kind}_s={s!r} and slo.{kind}_multiple={x!r} are both set; "
                                  f"allowed: one of them (set the other to null)")
        if self.ttft is None and self.tbt is None:
            raise ConfigError("slo: no deadline set (ttft_s, ttft_multiple, tbt_s, tbt_multiple "
                              "are all null); allowed: at least one, or slo=null for no SLO")

    def _deadline(self, kind: str) -> Deadline | None:
        s, x = getattr(self, f"{kind}_s"), getattr(self, f"{kind}_multiple")
        if s is not None:
            return Deadline(kind, "seconds", s)
        return None if x is None else Deadline(kind, "multiple", x)

    @property
    def ttft(self) -> Deadline | None:
        return self._deadline("ttft")

    @property
    def tbt(self) -> Deadline | None:
        return self._deadline("tbt")

    @staticmethod
    def build(value) -> "SLOConfig | None":
        """From None, an SLOConfig, or a dict of its fields (Hydra, ``gym.make``)."""
        if value is None or isinstance(value, SLOConfig):
            return value
        if not hasattr(value, "keys"):
            names = ", ".join(f.name for f in fields(SLOConfig))
            raise ConfigError(f"slo={value!r} must be a mapping of {names} or null")
        value = dict(value)
        reject_unknown("slo", value, [f.name for f in fields(SLOConfig)])
        return SLOConfig(**value)

    @property
    def per_task(self) -> bool:
        """Whether some deadline is given per task (and so depends on the workload's tasks)."""
        return any(isinstance(getattr(self, f.name), dict) for f in fields(self))

    def check_tasks(self, task_names: tuple[str, ...]) -> None:
        """Fail now (naming the option) if a per-task deadline does not match the workload."""
        for d in (self.ttft, self.tbt):
            if d is not None:
                d.per_task(tuple(task_names))


def isolated_ttft_s(latency, prompt_tokens, frontend=None, overlap_cpu: bool = False):
    """The request's TTFT alone on an idle instance as the engine records it (``first_token_s``
    - arrival): its prefill (``overlap_cpu``: ``engine.async_scheduling``), after the frontend's
    delay and input work if the instance has one (``frontend.FrontendModel``; its first-chunk
    work comes after the engine's first token, and a woken server's extra ``wake_s`` depends on
    how long it idled: neither counts). Scalars or arrays.

    Why the frontend counts: a deadline of 5x an isolated TTFT that leaves out a fixed ~30 ms of
    API-server latency is one no request meets on a fast GPU (the vLLM V1 presets: 2% of requests
    met it under every router), so attainment no longer tells routers apart."""
    out = latency.prefill_s(prompt_tokens, overlap_cpu=overlap_cpu)
    if frontend is not None:
        out = frontend.seen_s(out, prompt_tokens)
    return out


def isolated_decode_step_s(latency, prompt_tokens, overlap_cpu: bool = False):
    """The request's isolated decode step: one decode iteration of it alone on an idle instance
    at its first decode's context (prompt + 1 tokens). Scalars or arrays (one call per episode).

    Why not its mean step over the whole output: that depends on the true output length, and a
    router reads the deadline, so it would leak the length routers must not see (the mean step
    exceeds the first by ``decode_ctx_s x (d - 1) / 2``, about 1.5% for d = 1,000 on V100)."""
    p = np.asarray(prompt_tokens, np.float64)
    return latency.iteration_s(decode_seqs=1, decode_ctx_tokens=p + 1.0, overlap_cpu=overlap_cpu)


def request_deadlines(cfg: SLOConfig, latency, prompt_tokens, decode_tokens, task_id,
                      task_names: tuple[str, ...], frontend=None,
                      overlap_cpu: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT deadline, TBT deadline) in seconds per request; ``inf`` where a kind is off.

    ``latency`` is the instances' model, used only through ``prefill_s`` and ``iteration_s``, vectorised over the
    episode (one call per kind, not per request: an env reset computes them); ``frontend`` and
    ``overlap_cpu`` the same instances' ``frontend_model`` and ``async_scheduling``.
    ``decode_tokens`` is not used: see ``isolated_decode_step_s``."""
    prompt = np.asarray(prompt_tokens, np.int64)
    del decode_tokens   # deadlines must not depend on the output length (routers read them)
    task = np.asarray(task_id, np.int64)
    n = len(prompt)
    out = []
    for d, kind in ((cfg.ttft, "ttft"), (cfg.tbt, "tbt")):
        if d is None:
            out.append(np.full(n, math.inf))
            continue
        value = d.per_task(tuple(task_names))[task]
        if d.basis == "multiple":
            if kind == "ttft":
                iso = np.asarray(isolated_ttft_s(latency, prompt, frontend, overlap_cpu), np.float64) + np.zeros(n)
            else:
                iso = np.asarray(isolated_decode_step_s(latency, prompt, overlap_cpu), np.float64) + np.zeros(n)
            value = value * iso
        out.append(np.asarray(value, np.float64))
    return out[0], out[1]


def slo_met_masks(table, column=None) -> tuple[np.ndarray, np.ndarray]:
    """Per request: (met its TTFT deadline, met its TBT deadline); False unless it finished.
    The same arithmetic as ``RequestTable.meets_slo`` (the engine's count), element-wise.
    ``column``: a ``metrics.Columns`` of ``table`` to share conversions with."""
    from .request import Status

    column = column or table.column
    fin = column("status") == Status.FINISHED
    arr = column("arrival_s")
    first = column("first_token_s")
    finish = column("finish_s")
    dec = column("decode")
    with np.errstate(invalid="ignore", divide="ignore"):
        ttft_ok = fin & (first - arr <= column("ttft_deadline_s"))
        tbt = (finish - first) / np.maximum(dec - 1, 1)
        tbt_ok = fin & ((dec <= 1) | (tbt <= column("tbt_deadline_s")))
    return ttft_ok, tbt_ok


def slo_metrics(table, makespan_s: float, column=None) -> dict[str, float]:
    """SLO attainment (% of the episode's requests meeting both deadlines; also TTFT-only and
    TBT-only) and goodput: requests meeting both per second of the makespan (first arrival to
    last completion, the throughput's denominator), so goodput = throughput x the share of
    completed requests that met their SLO."""
    ttft_ok, tbt_ok = slo_met_masks(table, column)
    both = int(np.sum(ttft_ok & tbt_ok))
    n = table.n
    pct = (lambda k: 100.0 * k / n) if n else (lambda k: math.nan)
    return {
        "slo_met": both,
        "slo_attainment_pct": pct(both),
        "slo_ttft_attainment_pct": pct(int(np.sum(ttft_ok))),
        "slo_tbt_attainment_pct": pct(int(np.sum(tbt_ok))),
        "goodput_rps": both / makespan_s if makespan_s > 0 else 0.0,
    }
