"""Request accounting for the result tables: what the latency columns do not cover.

Latency means and percentiles are over completed requests only. A request rejected at arrival
(it can never fit the engine) or left unfinished (an episode cut at its step limit) drops out
of them silently, so a table whose cluster rejected two thirds of the requests can show a
healthy mean E2E. Every table therefore carries completed / rejected / unfinished counts
(means per episode) and, when more than ``LOSS_WARN_FRACTION`` of the requests were rejected or
left unfinished, a warning line above it; and its header names the workload actually replayed
(a trace's path and rate scale), read from the env rather than from the config group's name.

The same cells carry the latency SLO outcome (``llm_lb_gym/sim/slo.py``): SLO attainment (% of
all requests, rejected and unfinished ones counting as misses) and goodput (requests meeting
both deadlines per second of makespan); "n/a" where the env had no deadlines (``env.slo=null``).

Rows a setting's caps removed from a trace or corpus before sampling (``max_context_tokens``,
``max_prompt_tokens``, ``task_filter``, 0-token rows) are a line above the table
(``filter_note``) and a ``row_filters`` entry of ``run.json``, with the count per reason.
"""

from __future__ import annotations

import numpy as np

ACCOUNTING_COLUMNS = (("completed", "completed"), ("rejected", "rejected"),
                      ("unfinished", "unfinished"), ("prefix_hit_rate", "prefix hit rate"),
                      ("prefix_saved_tokens", "prefill tokens saved"),
                      ("slo_attainment_pct", "SLO met (%)"), ("goodput_rps", "goodput (req/s)"))
"""(metrics key, column title); each cell is the mean per episode. The prefix-caching columns
(``sim.metrics.prefix_cache_metrics``) read "n/a" where no instance caches prefixes, the SLO
columns where the episode had no deadlines."""
_SLO_FORMATS = {"slo_attainment_pct": "{:.1f}", "goodput_rps": "{:.2f}"}
LOSS_WARN_FRACTION = 0.01
"""Warn above this share of requests rejected or left unfinished."""


def _unfinished(row: dict) -> float:
    if "unfinished" in row:
        return float(row["unfinished"])
    return float(row["num_requests"] - row["completed"] - row["rejected"])


def _count(row: dict, key: str) -> float:
    if key == "unfinished":
        return _unfinished(row)
    return float(row.get(key, np.nan)) if key.startswith("prefix_") else float(row[key])


def _fmt(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def _cell(rows: list[dict], key: str) -> str:
    if key in _SLO_FORMATS:
        values = [r.get(key) for r in rows]
        if any(v is None or v != v for v in values):   # no deadlines (or a CSV's empty cell)
            return "n/a"
        return _SLO_FORMATS[key].format(np.mean([float(v) for v in values]))
    if key.startswith("prefix_") and not any(float(r.get("prefix_caching", 1.0) or 0.0) for r in rows):
        return "n/a"   # no instance caches prefixes: 0% would read as a measured miss rate
    x = float(np.mean([_count(r, key) for r in rows]))
    return f"{100 * x:.1f}%" if key == "prefix_hit_rate" else _fmt(x)


def accounting_cells(rows: list[dict]) -> list[str]:
    """completed, rejected, unfinished, prefix hit rate and tokens saved, SLO attainment and
    goodput over ``rows`` (episodes), as table cells."""
    return [_cell(rows, k) for k, _ in ACCOUNTING_COLUMNS]


def loss_warning(rows: list[dict]) -> str | None:
    """One loud line naming every policy whose episodes lost more than ``LOSS_WARN_FRACTION``
    of their requests to rejection or an unfinished end; None when none did."""
    parts = []
    for p in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == p]
        total = sum(float(r["num_requests"]) for r in mine)
        rej = sum(float(r["rejected"]) for r in mine)
        unf = sum(_unfinished(r) for r in mine)
        if total and (rej + unf) / total > LOSS_WARN_FRACTION:
            parts.append(f"{p} {100 * rej / total:.1f}% rejected, {100 * unf / total:.1f}% unfinished")
    if not parts:
        return None
    return (f"**WARNING: more than {100 * LOSS_WARN_FRACTION:g}% of requests were not completed** "
            f"({'; '.join(parts)}); the latency columns cover completed requests only. Rejected "
            "requests never fit the engine (see rejected_<reason> in results.csv); unfinished ones "
            "were in the system when the episode hit its step limit.")


def row_filters(workload) -> dict | None:
    """What the workload's filters removed from its file (``llm_lb_gym.workload.filters``), for
    ``run.json``; None for workloads that read no file or filter nothing."""
    report = getattr(workload, "row_filters", None)
    return None if report is None else report.as_dict()


def filter_note(workload) -> str | None:
    """One line for the table's header when filters removed rows or clipped outputs (a silent
    22-40% of a trace otherwise); None when they did neither."""
    report = getattr(workload, "row_filters", None)
    if report is None or not (report.rows_removed or report.decode_clipped):
        return None
    return f"**Trace rows:** {report.describe()}; episodes are drawn from the {report.rows_kept:,} left."


def describe_arrivals(arrivals) -> str:
    from llm_lb_gym.workload.arrivals import (DeterministicArrivals, GammaArrivals,
                                              PoissonArrivals, TraceArrivals)

    if isinstance(arrivals, PoissonArrivals):
        return f"Poisson {arrivals.rate_rps:g} req/s"
    if isinstance(arrivals, GammaArrivals):
        return f"gamma {arrivals.rate_rps:g} req/s, cv {arrivals.cv:g}"
    if isinstance(arrivals, DeterministicArrivals):
        return f"deterministic {arrivals.rate_rps:g} req/s"
    if isinstance(arrivals, TraceArrivals):
        return f"replayed timestamps ({len(arrivals.timestamps_s)} rows) at rate_scale {arrivals.rate_scale:g}"
    return repr(arrivals)


def describe_workload(workload, with_arrivals: bool = True) -> str:
    """The workload a built env replays, e.g. ``trace /data/x.csv (azure) at rate_scale 2``
    (a registered dataset also by name: ``(azure, dataset azure_conv)``); ``with_arrivals=False``
    leaves out synthetic arrival processes (a sweep varies them)."""
    from llm_lb_gym.workload.conversation import ConversationWorkload
    from llm_lb_gym.workload.corpus import CorpusWorkload
    from llm_lb_gym.workload.task_mix import TaskMixWorkload
    from llm_lb_gym.workload.trace_workload import TraceWorkload

    if isinstance(workload, TraceWorkload):
        dataset = f", dataset {workload.dataset}" if workload.dataset else ""
        text = f"trace {workload.path} ({workload.format}{dataset})"
        if workload.arrivals is None:
            return f"{text} at rate_scale {workload.rate_scale:g}"
        text += " token counts"   # the trace's lengths under a synthetic arrival process
    elif isinstance(workload, TaskMixWorkload):
        text = "task mix"
    elif isinstance(workload, ConversationWorkload):
        text = (f"conversations ({workload.num_system_prompts} system prompts x "
                f"{workload.system_prompt_tokens} tokens, {workload.turns_per_conversation} turns)")
    elif isinstance(workload, CorpusWorkload):
        text = f"corpus {workload.path} (split {workload.split})"
    else:
        return type(workload).__name__
    return f"{text}, {describe_arrivals(workload.arrivals)}" if with_arrivals else text
