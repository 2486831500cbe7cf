"""Merge the evaluations of a ``--multirun`` sweep into one table per evaluation.

    python -m llm_lb_gym.experiments.evaluate -m hydra/launcher=local_parallel episodes=5 seed=1000,1005,1010,1015
    python -m llm_lb_gym.experiments.merge multirun/evaluate/<time>      # one table over the 20 episodes

A sweep fans episodes (or settings, or training seeds) out over the launcher; each job writes
its own ``results.csv``. This step reads every job's results (jobs are the folders holding a
``.hydra/overrides.yaml``, or else the sweep folder's subfolders with a ``run.json``), groups
them by their path inside the job (``results.csv`` for ``evaluate``, ``<setting>/eval/results.csv``
for ``reproduce``), and writes ``<sweep>/merged/<that path>`` with ``summary.md``: the table of
``llm_lb_gym.experiments.evaluate`` over all the episodes, so four jobs of 5 episodes on seeds 1000, 1005,
1010, 1015 give the same table as one job of 20 episodes from seed 1000.

Rows of the same policy and episode seed from several jobs:

- identical (a heuristic on the same test seeds in every job of a training-seed sweep of
  ``reproduce``): kept once;
- different (the agents of that sweep, trained with different seeds): each job's rows become
  their own policy, ``<policy> [<the job's overrides that differ between jobs>]``, e.g.
  ``wg_rl [seed=1]``, and an extra table gives each such policy's change vs the baseline across
  the jobs: the mean over jobs of each job's paired change, with a 95% CI over jobs.

When the baseline's own rows differ between jobs (a sweep over settings: every policy, round
robin included, ran other episodes in each job), a change is only meaningful within a job: the
summary then has one table per job, each against that job's baseline, and the across-jobs
table pairs each job's policy with the same job's baseline.

``reproduction.md`` files of the jobs (a sweep of ``reproduce``) are concatenated into
``merged/reproduction.md`` under a heading naming each job's overrides; ``python -m
llm_lb_gym.experiments.figures <sweep>`` draws every job's figures.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import numpy as np

from llm_lb_gym.experiments._figures import BASELINE, read_results
from llm_lb_gym.experiments._tables import paired_change, summarize

NOT_COMPARED = ("wall_s", "job")
"""Columns that may differ between two runs of the same policy on the same episode."""


def find_jobs(sweep: Path) -> list[Path]:
    """The job folders of a sweep, in job order (Hydra's ``.hydra`` record, else ``run.json``)."""
    jobs = {p.parent.parent for p in sweep.rglob(".hydra/overrides.yaml") if p.parent.parent != sweep}
    if not jobs:
        jobs = {p.parent for p in sweep.glob("*/run.json")}
    jobs = {j for j in jobs if "merged" not in j.relative_to(sweep).parts}

    def order(job: Path):
        head = job.relative_to(sweep).parts[0].split("_", 1)[0]
        return (0, int(head), str(job)) if head.isdigit() else (1, 0, str(job))

    return sorted(jobs, key=order)


def job_overrides(job: Path) -> list[str]:
    from omegaconf import OmegaConf

    f = job / ".hydra" / "overrides.yaml"
    return [str(o) for o in OmegaConf.load(f)] if f.exists() else []


def _labels(jobs: list[Path]) -> dict[Path, str]:
    """Each job's overrides that are not shared by every job (its folder name if none)."""
    over = {j: job_overrides(j) for j in jobs}
    shared = set.intersection(*(set(o) for o in over.values())) if over else set()
    return {j: (",".join(o for o in over[j] if o not in shared) or j.name) for j in jobs}


def _same(a: dict, b: dict) -> bool:
    keys = (set(a) | set(b)) - set(NOT_COMPARED)
    for k in keys:
        x, y = a.get(k), b.get(k)
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y:
            return False
    return True


def merge_rows(parts: list[tuple[str, list[dict]]]) -> tuple[list[dict], dict[str, list[str]]]:
    """``parts``: (job label, rows). Returns the merged rows and, for each policy split by job,
    the names its rows now carry."""
    first: dict[tuple[str, int], tuple[str, dict]] = {}
    split: set[str] = set()
    for label, rows in parts:
        for r in rows:
            key = (r["policy"], r["seed"])
            if key in first and not _same(first[key][1], r):
                split.add(r["policy"])
            first.setdefault(key, (label, r))
    merged, seen, names = [], set(), {}
    for label, rows in parts:
        for r in rows:
            if r["policy"] in split:
                name = f"{r['policy']} [{label}]"
                names.setdefault(r["policy"], [])
                if name not in names[r["policy"]]:
                    names[r["policy"]].append(name)
                merged.append({**r, "policy": name, "job": label})
            elif (r["policy"], r["seed"]) not in seen:
                seen.add((r["policy"], r["seed"]))
                merged.append({**r, "job": label})
    return merged, names


def _job_of(policy: str, name: str) -> str:
    """The job label in a split policy's name ``<policy> [<label>]``."""
    return name[len(policy) + 2:-1]


def across_jobs(rows: list[dict], names: dict[str, list[str]], baseline: str) -> str:
    """Per split policy: the mean over jobs of each job's paired % change vs ``baseline`` (the
    same job's baseline when the baseline is split too), with a 95% Student-t CI over jobs."""
    from scipy import stats

    def base_of(name: str) -> dict:
        b = f"{baseline} [{_job_of(policy, name)}]" if baseline in names else baseline
        return {r["seed"]: r["mean_e2e_s"] for r in rows if r["policy"] == b}

    lines = [f"| policy | jobs | mean E2E vs {baseline}, mean over jobs (95% CI over jobs) | per job |",
             "|---|---|---|---|"]
    for policy, variants in names.items():
        if policy == baseline:
            continue
        changes = []
        for name in variants:
            base = base_of(name)
            own = {r["seed"]: r["mean_e2e_s"] for r in rows if r["policy"] == name}
            seeds = sorted(set(own) & set(base))
            if seeds:
                changes.append(paired_change(np.array([own[s] for s in seeds]), np.array([base[s] for s in seeds]))[0])
        c = np.array(changes)
        if not len(c):
            continue
        half = (stats.t.ppf(0.975, len(c) - 1) * c.std(ddof=1) / math.sqrt(len(c))) if len(c) > 1 else math.nan
        cell = f"{c.mean():+.2f}%" + ("" if math.isnan(half) else f" ± {half:.2f}")
        lines.append(f"| {policy} | {len(c)} | {cell} | " + ", ".join(f"{x:+.2f}%" for x in c) + " |")
    return "\n".join(lines)


def _baseline(job_csv: Path) -> str:
    from omegaconf import OmegaConf

    f = job_csv.parent / "resolved_config.yaml"
    return str(OmegaConf.load(f).get("baseline", BASELINE)) if f.exists() else BASELINE


def per_job_tables(rows: list[dict], names: dict[str, list[str]], baseline: str,
                   labels: list[str]) -> str:
    """One ``summarize`` table per job, each against that job's own baseline rows (the rows kept
    once, identical in every job, appear in each job's table)."""
    own_name = {n: p for p, variants in names.items() for n in variants}
    parts = []
    for label in labels:
        mine = [{**r, "policy": own_name[r["policy"]]} for r in rows
                if r["policy"] in own_name and _job_of(own_name[r["policy"]], r["policy"]) == label]
        mine += [r for r in rows if r["policy"] not in own_name]
        parts.append(f"### {label}\n\n" + summarize(mine, baseline))
    return "\n\n".join(parts)


def merge(sweep: Path, out: Path | None = None) -> dict[str, Path]:
    """Merge the sweep at ``sweep`` into ``out`` (default ``<sweep>/merged``); returns the
    ``summary.md`` written per evaluation path."""
    sweep = Path(sweep)
    out = Path(out) if out is not None else sweep / "merged"
    jobs = find_jobs(sweep)
    if not jobs:
        raise FileNotFoundError(f"{sweep}: no sweep jobs (folders with .hydra/overrides.yaml or run.json)")
    labels = _labels(jobs)
    groups: dict[str, list[tuple[Path, Path]]] = {}
    for job in jobs:
        for f in sorted(job.rglob("results.csv")):
            groups.setdefault(f.relative_to(job).as_posix(), []).append((job, f))
    written = {}
    for rel, files in groups.items():
        baseline = _baseline(files[0][1])
        rows, names = merge_rows([(labels[job], read_results(f)) for job, f in files])
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(dest, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        seeds = sorted({r["seed"] for r in rows})
        head = (f"Merged from {len(files)} jobs of {sweep} ({', '.join(labels[j] for j, _ in files)}): "
                f"{len(seeds)} episodes, seeds {seeds[0]}..{seeds[-1]}.\n\n")
        if baseline in names:   # the jobs ran different episodes: compare within each job
            text = head + (f"The baseline {baseline} differs between jobs: one table per job, each vs "
                           f"its own {baseline}.\n\n"
                           + per_job_tables(rows, names, baseline, [labels[j] for j, _ in files]) + "\n")
        else:
            text = head + summarize(rows, baseline) + "\n"
        if len(names) > (baseline in names):
            text += "\nAcross jobs:\n\n" + across_jobs(rows, names, baseline) + "\n"
        (dest.parent / "summary.md").write_text(text)
        written[rel] = dest.parent / "summary.md"
    reports = [(j, j / "reproduction.md") for j in jobs if (j / "reproduction.md").exists()]
    if reports:
        out.mkdir(parents=True, exist_ok=True)
        (out / "reproduction.md").write_text("\n".join(f"## {labels[j]}\n\n{f.read_text()}" for j, f in reports))
    if not written and not reports:
        raise FileNotFoundError(f"{sweep}: its {len(jobs)} jobs wrote no results.csv")
    return written


def main(argv: list[str] | None = None) -> None:
    prog = sys.argv[0] if sys.argv[0].startswith("llm-lb-gym") else "python -m llm_lb_gym.experiments.merge"
    ap = argparse.ArgumentParser(prog=prog,
                                 description="Merge the evaluations of a --multirun sweep into one table each.")
    ap.add_argument("sweep", type=Path, help="the sweep folder (hydra.sweep.dir)")
    ap.add_argument("--out", type=Path, default=None, help="default: <sweep>/merged")
    args = ap.parse_args(argv)
    for rel, path in merge(args.sweep, args.out).items():
        print(f"{rel}: {path}")
        print(path.read_text())


if __name__ == "__main__":
    main()
