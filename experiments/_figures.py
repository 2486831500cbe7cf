"""The figures of reproduce and load_sweep runs, drawn from the files a run wrote: the library
behind ``python -m llm_lb_gym.experiments.figures``, also called by reproduce, load_sweep and merge.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from llm_lb_gym.experiments._tables import paired_change

BASELINE = "round_robin"
NON_NUMERIC = ("policy",)


def read_results(path: Path) -> list[dict]:
    """``results.csv`` of ``llm_lb_gym.experiments.evaluate``, numbers as floats (``seed`` as int)."""
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row: dict = {}
            for key, value in raw.items():
                if key in NON_NUMERIC or value is None:
                    row[key] = value
                else:
                    try:
                        row[key] = float(value) if value != "" else math.nan
                    except ValueError:
                        row[key] = value
            row["seed"] = int(row["seed"])
            rows.append(row)
    return rows


def reductions(rows: list[dict], baseline: str = BASELINE) -> dict[str, tuple[float, float]]:
    """Per policy (baseline excluded): mean reduction of mean E2E vs ``baseline`` in % (positive
    = faster), paired over the episodes, and its 95% CI half-width (NaN with one episode)."""

    policies = list(dict.fromkeys(r["policy"] for r in rows))
    by = {p: {r["seed"]: r["mean_e2e_s"] for r in rows if r["policy"] == p} for p in policies}
    out = {}
    for p in policies:
        if p == baseline:
            continue
        seeds = sorted(set(by[p]) & set(by[baseline]))
        if seeds:
            mean, half = paired_change(np.array([by[p][s] for s in seeds]),
                                       np.array([by[baseline][s] for s in seeds]))
            out[p] = (-mean, half)
    return out


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_reduction_bars(rows: list[dict], path: Path, title: str, labels: dict[str, str] | None = None,
                        paper: dict[str, float] | None = None, trained: set[str] = frozenset(),
                        baseline: str = BASELINE, paper_label: str = "paper") -> Path:
    """Horizontal bars of each router's reduction vs ``baseline`` with 95% CI whiskers; trained
    agents in their own colour; the paper's values as black diamonds."""
    plt = _pyplot()
    labels, paper = labels or {}, paper or {}
    red = reductions(rows, baseline)
    names = sorted(red, key=lambda p: (p not in trained, -red[p][0]))
    y = np.arange(len(names))[::-1]
    fig, ax = plt.subplots(figsize=(7.5, 0.38 * len(names) + 1.4))
    means = np.array([red[p][0] for p in names])
    errs = np.array([0.0 if math.isnan(red[p][1]) else red[p][1] for p in names])
    colors = ["tab:orange" if p in trained else "tab:blue" for p in names]
    ax.barh(y, means, xerr=errs, color=colors, alpha=0.85, capsize=3, error_kw={"lw": 1})
    marked = [(yy, paper[p]) for yy, p in zip(y, names) if p in paper]
    if marked:
        ax.scatter([v for _, v in marked], [yy for yy, _ in marked], marker="D", color="black", zorder=3,
                   s=22, label=paper_label)
        ax.legend(loc="best", fontsize=8)
    ax.axvline(0, color="black", lw=0.8)
    # One collapsed agent (-70% +- 150) would squash every other bar to a line: the axis spans
    # what most routers reach, a bar or whisker cut at its edge ends in an arrow, and every
    # value is printed beside its router's name.
    ext = np.concatenate([means - errs, means + errs, list(paper.values()) or [0.0]])
    spread = 4.0 * np.percentile(np.abs(ext), 75) + 2.0
    lo, hi = min(max(ext.min(), -spread), 0.0), max(min(ext.max(), spread), 0.0)
    pad = 0.04 * (hi - lo) + 0.5
    ax.set_xlim(lo - pad, hi + pad)
    for yy, m, e in zip(y, means, errs):
        if m - e < lo - pad:
            ax.plot(lo - pad * 0.4, yy, marker="<", color="black", ms=6, clip_on=False)
        if m + e > hi + pad:
            ax.plot(hi + pad * 0.4, yy, marker=">", color="black", ms=6, clip_on=False)
    ticks = [f"{labels.get(p, p)}  {m:+.1f}" + (f" ± {e:.1f}" if e else "")
             for p, m, e in zip(names, means, errs)]
    ax.set_yticks(y, ticks, fontsize=8)
    ax.set_xlabel(f"mean E2E reduction vs {baseline} (%, 95% CI; positive = faster)")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_learning_curves(summaries: dict[str, dict], path: Path, title: str,
                         labels: dict[str, str] | None = None) -> Path | None:
    """Validation mean E2E vs training episodes per variant (``train_summary.json``'s
    ``validation`` list; episodes = step / episode_steps, the unit of ``train.episodes``: a
    router that defers takes more steps per episode than round robin). A check that left requests
    unfinished (its mean covers the finished ones only) is drawn hollow. None if no variant
    has a validation history."""
    plt = _pyplot()
    labels = labels or {}
    curves = {k: s for k, s in summaries.items() if s.get("validation")}
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    rr = []
    for key, s in curves.items():
        val = s["validation"]
        x = np.array([v["step"] for v in val], float) / float(s["episode_steps"])
        e2e = np.array([v["mean_e2e_s"] for v in val])
        line, = ax.plot(x, e2e, marker="o", ms=4, lw=1.3, label=labels.get(key, key))
        cut = np.array([v.get("unfinished", 0) > 0 for v in val])
        if cut.any():
            ax.scatter(x[cut], e2e[cut], s=40, facecolors="white", edgecolors=line.get_color(), zorder=3)
        rr += [v["round_robin_mean_e2e_s"] for v in val if "round_robin_mean_e2e_s" in v]
    if rr:
        ax.axhline(float(np.mean(rr)), color="gray", ls="--", lw=1, label="round robin")
    if any(v["mean_e2e_s"] > 0 for s in curves.values() for v in s["validation"]):
        ax.set_yscale("log")
    ax.set_xlabel("training episodes (training steps / round robin's steps per episode)")
    ax.set_ylabel("validation mean E2E (s)")
    ax.set_title(title + "\n(hollow: some requests unfinished at the step limit)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_load_sweep(results: list[tuple[float, list[dict]]], path: Path, title: str,
                    baseline: str = BASELINE) -> Path:
    """Each router's reduction of mean E2E vs ``baseline`` (95% CI) against the load factor."""
    plt = _pyplot()
    results = sorted(results, key=lambda r: r[0])
    per = [reductions(rows, baseline) for _, rows in results]
    factors = np.array([f for f, _ in results])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for p in dict.fromkeys(k for red in per for k in red):
        m = np.array([red.get(p, (math.nan, math.nan))[0] for red in per])
        e = np.array([red.get(p, (math.nan, math.nan))[1] for red in per])
        ax.errorbar(factors, m, yerr=np.nan_to_num(e), marker="o", ms=3.5, lw=1.2, capsize=2.5, label=p)
    ax.axhline(0, color="black", lw=0.8)
    ax.axvline(1, color="gray", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xticks(factors, [f"{f:g}" for f in factors])
    ax.set_xticks([], minor=True)
    ax.set_xlabel("load factor (offered rate / measured capacity)")
    ax.set_ylabel(f"mean E2E reduction vs {baseline} (%, positive = faster)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _config(run: Path) -> dict:
    from omegaconf import OmegaConf

    f = run / "resolved_config.yaml"
    return OmegaConf.to_container(OmegaConf.load(f), resolve=False) if f.exists() else {}


def reproduce_figures(run: Path, out: Path, prefix: str = "") -> list[Path]:
    """The reduction bars and learning curves of every setting of the reproduce run ``run``,
    as ``<out>/<prefix><setting>_*.png``."""
    cfg = _config(run)
    variants = cfg.get("variants") or {}
    written = []
    for entry in json.loads((run / "reproduction.json").read_text()):
        setting = entry["setting"]
        results = run / setting / "eval" / "results.csv"
        if "trained" not in entry or not results.exists():   # a transfer entry has its own folder
            continue
        labels = {k: (variants.get(k) or {}).get("label", k) for k in entry["trained"]}
        paper_key = (cfg.get("paper_as") or {}).get(setting, setting)
        paper = (cfg.get("paper") or {}).get(paper_key) or {}
        lf = entry.get("load_factor")
        title = f"{setting}" + (f" (load factor {lf:.2f})" if lf else "")
        eval_cfg = _config(run / setting / "eval")
        baseline = eval_cfg.get("baseline", BASELINE)
        written.append(plot_reduction_bars(
            read_results(results), out / f"{prefix}{setting}_reduction.png",
            f"{title}: {len({r['seed'] for r in read_results(results)})} test episodes", labels, paper,
            set(entry["trained"]), baseline, f"paper ({paper_key})"))
        summaries = {}
        for key, rec in entry["trained"].items():
            f = run / setting / key / "train_summary.json"
            if not f.exists() and rec.get("model"):
                f = Path(rec["model"]).parent / "train_summary.json"
            if f.exists():
                summaries[key] = json.loads(f.read_text())
        curve = plot_learning_curves(summaries, out / f"{prefix}{setting}_learning_curves.png",
                                     f"{title}: validation during training", labels)
        if curve is not None:
            written.append(curve)
    return written


def load_sweep_figure(run: Path, out: Path, prefix: str = "") -> Path:
    """The gain-vs-load plot of the load_sweep run ``run`` from its ``load_<f>/results.csv``."""
    results = [(float(d.name[len("load_"):]), read_results(d / "results.csv"))
               for d in run.glob("load_*") if (d / "results.csv").exists()]
    if not results:
        raise FileNotFoundError(f"{run}: no load_<factor>/results.csv")
    cfg = _config(run)
    env = cfg.get("env") or {}
    groups = env.get("instances")
    cluster = (" + ".join(f"{g.get('count', 1)} x {g.get('preset', (cfg.get('engine') or {}).get('preset', '?'))}"
                          for g in groups) if groups else
               f"{env.get('num_instances') or 4} instances, {(cfg.get('engine') or {}).get('preset', '?')}")
    title = (f"{cluster}: "
             f"{cfg.get('episodes', '?')} episodes per load, paired 95% CI")
    return plot_load_sweep(results, out / f"{prefix}load_sweep_gain.png", title, cfg.get("baseline", BASELINE))
