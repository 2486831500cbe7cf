"""Paired statistics and the result table every comparison prints (evaluate, train, improve,
reproduce, load_sweep, merge, figures): one definition of "% change vs the baseline, paired per
episode, 95% Student-t CI". Kept apart from ``_evaluation`` so that merging and drawing finished
runs needs neither the ``rl`` extra nor a simulator.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from llm_lb_gym.experiments._accounting import ACCOUNTING_COLUMNS, accounting_cells

TABLE_COLUMNS = (
    ("mean_e2e_s", "mean E2E (s)"), ("p99_e2e_s", "p99 E2E (s)"), ("mean_ttft_s", "mean TTFT (s)"),
    ("p99_ttft_s", "p99 TTFT (s)"), ("mean_tbt_s", "mean TBT (s)"), ("p99_tbt_s", "p99 TBT (s)"),
    ("preemptions", "preemptions"), ("mean_router_wait_s", "router wait (s)"),
)


def paired_change(values: np.ndarray, base: np.ndarray) -> tuple[float, float]:
    """Mean % change of ``values`` vs ``base`` over paired episodes and its 95% CI half-width."""
    pct = 100.0 * (values - base) / base
    if len(pct) < 2:
        return float(pct.mean()), math.nan
    half = stats.t.ppf(0.975, len(pct) - 1) * pct.std(ddof=1) / math.sqrt(len(pct))
    return float(pct.mean()), float(half)


def paired_difference(values: np.ndarray, base: np.ndarray) -> tuple[float, float]:
    """Mean of ``values - base`` over paired episodes and its 95% CI half-width (NaN with one
    episode): for quantities already in percent, such as SLO attainment (points)."""
    diff = np.asarray(values, np.float64) - np.asarray(base, np.float64)
    if len(diff) < 2:
        return float(diff.mean()), math.nan
    half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / math.sqrt(len(diff))
    return float(diff.mean()), float(half)


def _ci(mean: float, half: float, unit: str) -> str:
    return f"{mean:+.2f}{unit} ± {half:.2f}" if not math.isnan(half) else f"{mean:+.2f}{unit}"


def summarize(rows: list[dict], baseline: str) -> str:
    """The markdown table: per policy, means over episodes, the requests completed / rejected /
    unfinished per episode (the latency columns cover completed ones only), SLO attainment and
    goodput, the % change of mean E2E and, with deadlines, the change of SLO attainment in
    percentage points, both paired per episode vs ``baseline``."""
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    by = {p: sorted((r for r in rows if r["policy"] == p), key=lambda r: r["seed"]) for p in policies}
    base = np.array([r["mean_e2e_s"] for r in by[baseline]]) if baseline in by else None
    slo = all(r.get("slo_attainment_pct") is not None for r in rows)
    base_slo = (np.array([r["slo_attainment_pct"] for r in by[baseline]], np.float64)
                if slo and baseline in by else None)
    titles = [t for _, t in TABLE_COLUMNS + ACCOUNTING_COLUMNS]
    head = "| policy | " + " | ".join(titles) + f" | mean E2E vs {baseline} (95% CI) |"
    if slo:
        head += f" SLO met vs {baseline} (points, 95% CI) |"
    lines = [head, "|" + "---|" * (len(titles) + 2 + slo)]
    for p in policies:
        cells = [f"{np.mean([r[k] for r in by[p]]):.3f}" if k != "preemptions"
                 else f"{np.mean([r[k] for r in by[p]]):.1f}" for k, _ in TABLE_COLUMNS]
        if base is not None and len(by[p]) == len(base):
            change = _ci(*paired_change(np.array([r["mean_e2e_s"] for r in by[p]]), base), "%")
        else:
            change = "n/a"
        cells += accounting_cells(by[p])
        line = f"| {p} | " + " | ".join(cells) + f" | {change} |"
        if slo:
            if base_slo is not None and len(by[p]) == len(base_slo):
                mine = np.array([r["slo_attainment_pct"] for r in by[p]], np.float64)
                line += f" {_ci(*paired_difference(mine, base_slo), '')} |"
            else:
                line += " n/a |"
        lines.append(line)
    return "\n".join(lines)
