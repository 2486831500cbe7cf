"""Where does routing matter? Heuristics vs round robin across load factors.

    python -m llm_lb_gym.experiments.load_sweep                                   # default env (4x V100)
    python -m llm_lb_gym.experiments.load_sweep load_factors=[0.5,1,2] episodes=3 engine=a100_llama3

Load factor = offered arrival rate / service capacity. The capacity ``mu`` is measured, not
assumed: round robin on an episode whose requests all arrive at once (``capacity_rate_rps``),
throughput over the middle of the run (completions between the 10th and 90th percentile of
finish times), so the ramp-up and the drain tail, where instances idle, do not count. For each
factor ``f`` the sweep runs ``llm_lb_gym.experiments.evaluate`` at ``arrival_rate_rps = f * mu`` (its own
subfolder ``load_<f>``) and writes ``load_sweep.md``: round robin's mean E2E and preemptions,
and every policy's paired % change of mean E2E vs round robin with its 95% CI.

Only workloads with synthetic arrivals (the task mix, length-only traces) take an arrival
rate; a timestamped trace is scaled with its ``workload.rate_scale`` instead and is rejected here.
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("rl", "llm-lb-gym load_sweep")

import math
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from llm_lb_gym.experiments._accounting import (ACCOUNTING_COLUMNS, accounting_cells, describe_workload,
                                     filter_note, loss_warning)
from llm_lb_gym.experiments._entry_options import check_evaluate_options
from llm_lb_gym.experiments._evaluation import evaluate
from llm_lb_gym.experiments._figures import load_sweep_figure
from llm_lb_gym.experiments._hydra import env_kwargs, hydra_main, run_dir, to_container, write_run_record
from llm_lb_gym.experiments._progress import progress_bar
from llm_lb_gym.experiments._tables import paired_change
from llm_lb_gym.capacity import CAPACITY_QUANTILES, capacity_rps  # noqa: F401  (re-exported)


def offered_load(rate_rps: float, capacity: float) -> float:
    return rate_rps / capacity


def _sweep_table(results: list[tuple[float, float, dict]], baseline: str) -> str:
    """One row per load factor: baseline's latency, each policy's % change with CI, and the
    requests completed / rejected / unfinished per episode, SLO attainment and goodput (means
    over every policy's episodes; results.csv has them per policy)."""
    policies = list(dict.fromkeys(r["policy"] for _, _, ev in results for r in ev["rows"]))
    head = (f"| load factor | arrival rate (req/s) | {baseline} mean E2E (s) | {baseline} preemptions | "
            + " | ".join(p for p in policies if p != baseline) + " | best | "
            + " | ".join(t for _, t in ACCOUNTING_COLUMNS) + " |")
    lines = [head, "|" + "---|" * (len(policies) + 4 + len(ACCOUNTING_COLUMNS))]
    for factor, rate, ev in results:
        by = {p: sorted((r for r in ev["rows"] if r["policy"] == p), key=lambda r: r["seed"]) for p in policies}
        base = np.array([r["mean_e2e_s"] for r in by[baseline]])
        cells, best = [], (baseline, 0.0)
        for p in policies:
            if p == baseline:
                continue
            mean, half = paired_change(np.array([r["mean_e2e_s"] for r in by[p]]), base)
            cells.append(f"{mean:+.1f}" + ("" if math.isnan(half) else f" ± {half:.1f}"))
            if mean < best[1]:
                best = (p, mean)
        pre = np.mean([r["preemptions"] for r in by[baseline]])
        lines.append(f"| {factor:g} | {rate:.1f} | {base.mean():.2f} | {pre:.0f} | " + " | ".join(cells)
                     + f" | {best[0]} ({best[1]:+.1f}%) | " + " | ".join(accounting_cells(ev["rows"])) + " |")
    return "\n".join(lines)


def check_load_factors(value) -> None:
    """A non-empty list of distinct numbers > 0 (multiples of the measured capacity)."""
    from llm_lb_gym._validate import ConfigError, check_range

    factors = to_container(value) if OmegaConf.is_config(value) else value
    if isinstance(factors, str) or not isinstance(factors, (list, tuple)) or not factors:
        raise ConfigError(f"load_factors={factors!r} must be a non-empty list of numbers > 0, "
                          "e.g. load_factors=[0.5,1,2]")
    for i, f in enumerate(factors):
        check_range(f"load_factors[{i}]", f, 0.0, 1000.0, lo_open=True)
    if len({float(f) for f in factors}) != len(factors):
        raise ConfigError(f"load_factors={list(factors)} lists a factor twice")


def load_sweep(cfg, out: Path | None = None) -> dict:
    """Measure capacity, evaluate ``cfg.policies`` at each load factor; returns the table."""
    import torch

    from llm_lb_gym._validate import ConfigError
    from llm_lb_gym.envs.builders import build_workload
    from llm_lb_gym.workload.registry import synthetic_arrival_workloads, uses_synthetic_arrivals

    torch.set_num_threads(1)
    check_load_factors(cfg.get("load_factors"))
    check_evaluate_options(cfg)   # every load factor's evaluation, before the capacity run
    out = Path(out) if out is not None else run_dir(cfg)
    write_run_record(out, cfg)
    kw = env_kwargs(cfg)
    wname = kw["workload"].get("name")
    if not uses_synthetic_arrivals(wname, kw["workload"]):
        raise ConfigError(f"workload {wname!r} has its own timestamps; load_sweep needs one of "
                          f"{', '.join(synthetic_arrival_workloads())} or a length-only trace "
                          "(workload=trace workload.format=lengths); scale a trace with "
                          "workload.rate_scale")
    if cfg.baseline not in cfg.policies:
        raise ConfigError(f"baseline={cfg.baseline!r} must be one of policies={list(cfg.policies)}")
    t0 = time.perf_counter()
    mu = capacity_rps(kw, int(cfg.seed))
    print(f"service capacity (round robin, saturated): {mu:.2f} req/s", flush=True)
    results = []
    with progress_bar(len(cfg.load_factors), "load sweep", cfg.get("progress", True), unit="load") as bar:
        for factor in cfg.load_factors:
            bar.set_postfix_str(f"load factor {float(factor):g}")
            rate = float(factor) * mu
            ev_cfg = OmegaConf.create({**to_container(cfg), "env": {**to_container(cfg.env), "arrival_rate_rps": rate}})
            ev = evaluate(ev_cfg, out=out / f"load_{float(factor):g}", leave_bars=False)
            results.append((float(factor), rate, ev))
            bar.update()
    table = _sweep_table(results, cfg.baseline)
    wall = time.perf_counter() - t0
    workload = describe_workload(build_workload(kw["workload"], kw.get("arrival_rate_rps")), False)
    from llm_lb_gym.envs.config import EnvConfig
    from llm_lb_gym.sim.config import ClusterConfig

    ecfg = EnvConfig(**{k: kw[k] for k in ("num_instances", "engine", "instances") if k in kw})
    cluster = ClusterConfig(ecfg.num_instances, ecfg.engine, instances=ecfg.instances).describe()
    header = (f"capacity {mu:.2f} req/s ({cluster}, "
              f"workload {workload}, {kw['num_requests']} requests); {cfg.episodes} episodes per load, "
              f"seeds {cfg.seed}..{int(cfg.seed) + int(cfg.episodes) - 1}; cells: % change of mean E2E vs "
              f"{cfg.baseline} (95% CI); wall {wall:.0f} s")
    alerts = [f"load factor {f:g}: {w}" for f, _, ev in results if (w := loss_warning(ev["rows"]))]
    note = filter_note(build_workload(kw["workload"], kw.get("arrival_rate_rps")))
    if note:
        alerts.insert(0, note)
    if alerts:
        header += "\n\n" + "\n\n".join(alerts)
    (out / "load_sweep.md").write_text(header + "\n\n" + table + "\n")
    if cfg.get("figures", True):
        print(f"figure: {load_sweep_figure(out, out)}")   # from the files just written, as the CLI does
    print(header)
    print(table)
    return {"capacity_rps": mu, "table": table, "results": results, "out": out}


@hydra_main("load_sweep")
def main(cfg) -> None:
    load_sweep(cfg)


if __name__ == "__main__":
    main()
