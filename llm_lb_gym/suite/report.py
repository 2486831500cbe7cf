"""Per-condition rows, the tail constraint, and the aggregate over a suite, with paired intervals.

Everything is paired: each policy's episode is compared with round robin's (or another
policy's) on the same condition and seed. Changes are log ratios of mean E2E, reported as %
(``100 (exp(x) - 1)``), so averaging over conditions is a geometric mean and no condition's
scale dominates.

- **per condition**: the mean over seeds of each metric; the change of mean E2E vs round robin
  with its 95% Student-t interval over seeds; SLO attainment change in points; whether the
  policy meets the **tail constraint** there: mean p99 TTFT <= ``TTFT_RATIO`` x round robin's
  and mean SLO attainment >= round robin's - ``SLO_POINTS`` (the objective a deployment would
  accept: mean latency may improve only if the tail and the SLOs do not pay for it).
- **aggregate** per policy: the geometric-mean ratio of mean E2E vs round robin over conditions,
  its 95% interval (Welch-Satterthwaite over the conditions' seed variances), conditions where
  it meets the constraint, the suite-level constraint (geometric-mean p99 TTFT ratio <=
  ``TTFT_RATIO`` and mean SLO change >= -``SLO_POINTS``), win / tie / loss against the best
  heuristic of each condition (the heuristic with the lowest mean E2E there, chosen after the
  fact: the strongest reading of "best heuristic"; win = interval entirely below zero), and the
  worst condition against late_binding (points of the change vs round robin).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
from scipy import stats

BASELINE = "round_robin"
TTFT_RATIO = 1.1
SLO_POINTS = 2.0


def _t(df: float) -> float:
    return float(stats.t.ppf(0.975, df)) if df >= 1 else math.nan


def _mean_half(x: np.ndarray) -> tuple[float, float]:
    if len(x) < 2:
        return float(x.mean()), math.nan
    return float(x.mean()), _t(len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))


def pct(x: float) -> float:
    """A log ratio as a % change."""
    return 100.0 * math.expm1(x)


class SuiteResult:
    """The rows of one benchmark run, indexed by (condition, policy, seed)."""

    def __init__(self, rows: list[dict], baseline: str = BASELINE):
        self.rows = rows
        self.baseline = baseline
        self.conditions = list(dict.fromkeys(r["condition"] for r in rows))
        self.policies = list(dict.fromkeys(r["policy"] for r in rows))
        self.kind = {r["policy"]: r["kind"] for r in rows}
        self._by = defaultdict(dict)
        for r in rows:
            self._by[(r["condition"], r["policy"])][r["seed"]] = r
        if baseline not in self.policies:
            raise ValueError(f"the benchmark needs its baseline {baseline!r} among the policies")

    def values(self, cond: str, policy: str, key: str, against: str | None = None):
        """Paired arrays over the seeds both ran (``against``: the second policy's too)."""
        a = self._by[(cond, policy)]
        if against is None:
            seeds = sorted(a)
            return np.array([a[s][key] for s in seeds], np.float64)
        b = self._by[(cond, against)]
        seeds = sorted(set(a) & set(b))
        return (np.array([a[s][key] for s in seeds], np.float64),
                np.array([b[s][key] for s in seeds], np.float64))

    def log_ratio(self, cond: str, policy: str, against: str) -> np.ndarray:
        a, b = self.values(cond, policy, "mean_e2e_s", against)
        return np.log(a / b)

    def mean(self, cond: str, policy: str, key: str) -> float:
        v = self.values(cond, policy, key)
        return float(np.nanmean(v)) if len(v) and not np.isnan(v).all() else math.nan

    # ------------------------------------------------------------------ per condition
    def meets(self, cond: str, policy: str) -> bool:
        b = self.baseline
        ttft_ok = self.mean(cond, policy, "p99_ttft_s") <= TTFT_RATIO * self.mean(cond, b, "p99_ttft_s")
        slo_p, slo_b = self.mean(cond, policy, "slo_attainment_pct"), self.mean(cond, b, "slo_attainment_pct")
        slo_ok = math.isnan(slo_b) or slo_p >= slo_b - SLO_POINTS
        return bool(ttft_ok and slo_ok)

    def heuristics(self) -> list[str]:
        return [p for p in self.policies if self.kind[p] == "heuristic"]

    def best_heuristic(self, cond: str, constrained: bool = False) -> str | None:
        cands = [p for p in self.heuristics() if not constrained or self.meets(cond, p)]
        if not cands:
            return None
        return min(cands, key=lambda p: self.mean(cond, p, "mean_e2e_s"))

    def change(self, cond: str, policy: str, against: str | None = None) -> tuple[float, float]:
        """Mean log ratio of mean E2E vs ``against`` (default round robin) and its half-width."""
        return _mean_half(self.log_ratio(cond, policy, against or self.baseline))

    def versus(self, cond: str, policy: str, other: str) -> str:
        """'win', 'tie' or 'loss' of ``policy`` against ``other`` on ``cond``."""
        if policy == other:
            return "tie"
        m, h = self.change(cond, policy, other)
        if math.isnan(h):
            return "tie"
        return "win" if m + h < 0 else "loss" if m - h > 0 else "tie"

    # ------------------------------------------------------------------ aggregate
    def aggregate_change(self, policy: str, against: str | None = None) -> tuple[float, float]:
        """Mean over conditions of the mean log ratio, and its 95% half-width."""
        means, var, dfs = [], [], []
        for c in self.conditions:
            x = self.log_ratio(c, policy, against or self.baseline)
            means.append(x.mean())
            n = len(x)
            v = x.var(ddof=1) / n if n > 1 else math.nan
            var.append(v)
            dfs.append(n - 1)
        k = len(means)
        se2 = np.array(var) / k ** 2
        m = float(np.mean(means))
        if np.isnan(se2).any():
            return m, math.nan
        tot = se2.sum()
        if tot == 0.0:
            return m, 0.0
        df = tot ** 2 / np.sum(se2 ** 2 / np.maximum(np.array(dfs), 1))
        return m, _t(df) * math.sqrt(tot)

    def suite_meets(self, policy: str) -> bool:
        b = self.baseline
        ratios = [self.mean(c, policy, "p99_ttft_s") / self.mean(c, b, "p99_ttft_s") for c in self.conditions]
        slo = [self.mean(c, policy, "slo_attainment_pct") - self.mean(c, b, "slo_attainment_pct")
               for c in self.conditions]
        slo = [x for x in slo if not math.isnan(x)]
        return bool(math.exp(np.mean(np.log(ratios))) <= TTFT_RATIO
                    and (not slo or np.mean(slo) >= -SLO_POINTS))

    def aggregate_rows(self) -> list[dict]:
        out = []
        late = "late_binding" if "late_binding" in self.policies else None
        for p in self.policies:
            m, h = self.aggregate_change(p)
            wtl = {"win": 0, "tie": 0, "loss": 0}
            for c in self.conditions:
                best = self.best_heuristic(c)
                wtl[self.versus(c, p, best)] += 1
            worst = None
            if late is not None:
                worst = max(self.change(c, p)[0] - self.change(c, late)[0] for c in self.conditions)
            ttft = math.exp(np.mean([math.log(self.mean(c, p, "p99_ttft_s") / self.mean(c, self.baseline, "p99_ttft_s"))
                                     for c in self.conditions]))
            slo = [self.mean(c, p, "slo_attainment_pct") - self.mean(c, self.baseline, "slo_attainment_pct")
                   for c in self.conditions]
            slo = [x for x in slo if not math.isnan(x)]
            out.append({"policy": p, "kind": self.kind[p], "log_change": m, "half": h,
                        "change_pct": pct(m), "ci_pct": (pct(m - h) if not math.isnan(h) else math.nan,
                                                         pct(m + h) if not math.isnan(h) else math.nan),
                        "p99_ttft_ratio": ttft, "slo_change_points": float(np.mean(slo)) if slo else math.nan,
                        "conditions_meeting": sum(self.meets(c, p) for c in self.conditions),
                        "suite_meets": self.suite_meets(p), "wins": wtl["win"], "ties": wtl["tie"],
                        "losses": wtl["loss"],
                        "worst_vs_late_binding_points": None if worst is None else 100.0 * worst})
        return out

    def best(self, kind: str, constrained: bool) -> str | None:
        """The policy of ``kind`` with the lowest aggregate change (meeting the suite-level
        constraint when ``constrained``)."""
        cands = [p for p in self.policies if self.kind[p] == kind and (not constrained or self.suite_meets(p))]
        return min(cands, key=lambda p: self.aggregate_change(p)[0]) if cands else None

    def headline(self) -> list[str]:
        """The comparisons the targets name: best trained vs best heuristic, unconstrained and
        among the policies meeting the suite-level constraint."""
        lines = []
        for constrained in (False, True):
            t, h = self.best("trained", constrained), self.best("heuristic", constrained)
            tag = "meeting the tail constraint" if constrained else "by mean E2E"
            if t is None or h is None:
                lines.append(f"best trained vs best heuristic {tag}: "
                             f"{'no trained router' if t is None else t} / {'no heuristic' if h is None else h} qualifies")
                continue
            m, hw = self.aggregate_change(t, h)
            gt, gh = self.aggregate_change(t)[0], self.aggregate_change(h)[0]
            lines.append(f"best trained vs best heuristic {tag}: {t} ({pct(gt):+.2f}% vs round robin) vs "
                         f"{h} ({pct(gh):+.2f}%): {100 * (gt - gh):+.2f} points of log ratio, paired "
                         f"{pct(m):+.2f}% [{pct(m - hw):+.2f}, {pct(m + hw):+.2f}] (95% CI)")
        return lines


def _fmt_ci(m: float, h: float) -> str:
    if math.isnan(h):
        return f"{pct(m):+.2f}%"
    return f"{pct(m):+.2f}% [{pct(m - h):+.2f}, {pct(m + h):+.2f}]"


def condition_table(res: SuiteResult, cond: str) -> str:
    """One condition's markdown table: a row per policy."""
    best = res.best_heuristic(cond)
    head = ("| policy | kind | mean E2E (s) | p99 E2E (s) | p99 TTFT (s) | SLO met (%) | goodput (req/s) "
            "| vs round robin (95% CI) | SLO vs RR (points) | tail constraint | vs best heuristic |")
    lines = [f"**{cond}** ({len(res.values(cond, res.baseline, 'mean_e2e_s'))} seeds; best heuristic: {best})",
             "", head, "|" + "---|" * 11]
    for p in res.policies:
        slo = res.mean(cond, p, "slo_attainment_pct") - res.mean(cond, res.baseline, "slo_attainment_pct")
        lines.append(
            f"| {p} | {res.kind[p]} | {res.mean(cond, p, 'mean_e2e_s'):.3f} | {res.mean(cond, p, 'p99_e2e_s'):.2f} "
            f"| {res.mean(cond, p, 'p99_ttft_s'):.2f} | {res.mean(cond, p, 'slo_attainment_pct'):.1f} "
            f"| {res.mean(cond, p, 'goodput_rps'):.2f} | {_fmt_ci(*res.change(cond, p))} | {slo:+.1f} "
            f"| {'yes' if res.meets(cond, p) else 'no'} | {res.versus(cond, p, best) if best else 'n/a'} |")
    return "\n".join(lines)


def aggregate_table(res: SuiteResult) -> str:
    """The suite's aggregate: a row per policy."""
    head = ("| policy | kind | mean E2E vs round robin (geo. mean, 95% CI) | p99 TTFT / RR (geo. mean) "
            "| SLO vs RR (points) | conditions meeting the tail constraint | suite meets it "
            "| win / tie / loss vs best heuristic | worst condition vs late_binding (points) |")
    lines = [head, "|" + "---|" * 9]
    for r in res.aggregate_rows():
        worst = r["worst_vs_late_binding_points"]
        lines.append(
            f"| {r['policy']} | {r['kind']} | {_fmt_ci(r['log_change'], r['half'])} | {r['p99_ttft_ratio']:.2f} "
            f"| {r['slo_change_points']:+.1f} | {r['conditions_meeting']} of {len(res.conditions)} "
            f"| {'yes' if r['suite_meets'] else 'no'} | {r['wins']} / {r['ties']} / {r['losses']} "
            f"| {'n/a' if worst is None else f'{worst:+.1f}'} |")
    return "\n".join(lines)


def overview_table(res: SuiteResult, key: str = "change") -> str:
    """A policy per row, a condition per column: the change of mean E2E vs round robin (%)."""
    head = "| policy | " + " | ".join(res.conditions) + " |"
    lines = [head, "|" + "---|" * (len(res.conditions) + 1)]
    for p in res.policies:
        cells = [f"{pct(res.change(c, p)[0]):+.1f}" for c in res.conditions]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
