"""The paper's result tables on this simulator, beside the paper's numbers.

    python -m llm_lb_gym.experiments.reproduce                                  # paper_v100, three variants
    python -m llm_lb_gym.experiments.reproduce 'settings=[paper_v100,paper_v100_kv_limited]'
    python -m llm_lb_gym.experiments.reproduce train_episodes=60 eval_episodes=20 agent=double_dqn
    python -m llm_lb_gym.experiments.reproduce models_from=outputs/reproduce/<run>   # re-evaluate only

For each setting (a ``conf/experiment`` config) and each variant (Baseline RL, WA-RL, WG-RL:
the same agent trained with reward ``baseline``, ``workload_aware``, ``workload_guided``), it
runs :func:`llm_lb_gym.experiments._training.train` into ``<run>/<setting>/<variant>/``; then one
:func:`llm_lb_gym.experiments._evaluation.evaluate` puts the trained agents and the heuristics on identical
seeded episodes (``<run>/<setting>/eval/``). ``reproduction.md`` holds one table per setting in
the paper's format (mean E2E, reduction vs round robin with a 95% CI, router wait,
preemptions) with the paper's reduction beside each row, and a header with the setting's load
factor (offered rate / measured capacity, :func:`llm_lb_gym.capacity.capacity_rps`), the
training length and the wall times.

The paper reports reductions (positive = faster than round robin); ``llm_lb_gym.experiments.evaluate``
reports changes (negative = faster). The table here uses the paper's sign.
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("rl", "llm-lb-gym reproduce")

import json
import math
import time
from pathlib import Path

import numpy as np
from omegaconf import open_dict

from llm_lb_gym.experiments._accounting import ACCOUNTING_COLUMNS, accounting_cells
from llm_lb_gym.experiments._evaluation import evaluate
from llm_lb_gym.experiments._figures import reproduce_figures
from llm_lb_gym.experiments._hydra import compose, env_kwargs, hydra_main, run_dir, to_container, write_run_record
from llm_lb_gym.experiments._progress import progress_bar, say
from llm_lb_gym.experiments._reproduce_options import (TRAINERS, STEPS_PER_REQUEST_LIMIT,  # noqa: F401
                                                       _experiment, _with_workload, check_reproduce_options,
                                                       eval_config, improve_overrides, train_overrides)
from llm_lb_gym.experiments._tables import paired_change
from llm_lb_gym.experiments._training import train, train_distilled
from llm_lb_gym.capacity import capacity_rps

def offered_rate_rps(kw: dict, seed: int) -> float:
    """Requests per second of one episode's arrivals (synthetic or replayed trace alike)."""
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401

    env = gym.make("LLMCluster-v0", **{**kw, "reward": {**(kw.get("reward") or {}), "mode": "baseline"}})
    env.reset(seed=seed)
    arr = env.unwrapped.batch.arrival_s
    return float((len(arr) - 1) / (arr.max() - arr.min())) if len(arr) > 1 else math.nan


def _model_path(run: Path, agent: str) -> Path:
    from llm_lb_gym.agents import agent_spec

    suffix = agent_spec(agent).file_suffix
    best = run / f"best_model{suffix}"
    return best if best.exists() else run / f"model{suffix}"


def paper_table(rows: list[dict], labels: dict[str, str], paper: dict, paper_wait: dict,
                baseline: str = "round_robin") -> str:
    """One row per router: mean E2E and its paired change vs ``baseline`` (the paper's sign:
    positive = faster), the p99 E2E and its change, preemptions, router waits (mean and p99: the
    price of holding requests), the worst episode's distance from the router's median episode
    (a collapsing policy shows here), request accounting, and the paper's numbers."""

    policies = list(dict.fromkeys(r["policy"] for r in rows))
    by = {p: sorted((r for r in rows if r["policy"] == p), key=lambda r: r["seed"]) for p in policies}
    base = np.array([r["mean_e2e_s"] for r in by[baseline]])
    base99 = np.array([r["p99_e2e_s"] for r in by[baseline]])
    lines = ["| router | mean E2E (s) | reduction vs RR (%, 95% CI) | p99 E2E (s) | p99 change vs RR (%) "
             "| preemptions | router wait mean / p99 (s) | worst episode vs median (points) "
             "| " + " | ".join(t for _, t in ACCOUNTING_COLUMNS) + " | s per episode "
             "| paper: reduction vs RR (%) | paper: router wait (s) |",
             "|" + "---|" * (11 + len(ACCOUNTING_COLUMNS))]
    order = sorted(policies, key=lambda p: (p != baseline, p not in labels, policies.index(p)))
    for p in order:
        e2e = np.array([r["mean_e2e_s"] for r in by[p]])
        mean, half = paired_change(e2e, base)
        red = "0 (baseline)" if p == baseline else (
            f"{-mean:+.2f}" + ("" if math.isnan(half) else f" ± {half:.2f}"))
        p99 = np.array([r["p99_e2e_s"] for r in by[p]])
        p99_change = "" if p == baseline else f"{np.mean(100 * (p99 - base99) / base99):+.1f}"
        wait = np.mean([r["mean_router_wait_s"] for r in by[p]])
        wait99 = np.mean([r.get("p99_router_wait_s", math.nan) for r in by[p]])
        pre = np.mean([r["preemptions"] for r in by[p]])
        change = 100 * (e2e - base) / base
        worst = float(np.max(np.abs(change - np.median(change))))
        wall = np.mean([r.get("wall_s", math.nan) for r in by[p]])
        pp, pw = paper.get(p), paper_wait.get(p)
        lines.append(f"| {labels.get(p, p)} | {e2e.mean():.2f} | {red} | {p99.mean():.1f} | {p99_change} | "
                     f"{pre:.0f} | {wait:.2f} / {wait99:.1f} | {worst:.1f} | "
                     + " | ".join(accounting_cells(by[p])) + f" | {wall:.2g} | "
                     f"{'' if pp is None else f'{pp:+.2f}'} | {'' if pw is None else f'{pw:.2f}'} |")
    return "\n".join(lines)


def _train_distilled_variant(cfg, setting: str, key: str, out: Path) -> dict:
    """A variant with ``trainer: improve``: policy iteration on the setting (``conf/improve.yaml``
    with the variant's experiments, :func:`improve_overrides`)."""
    overrides, note = improve_overrides(cfg, setting, key)
    if note:
        say(note)
    icfg = _with_workload(cfg, compose("improve", overrides))
    res = train_distilled(icfg, out)
    return {**{k: res[k] for k in ("model", "kind", "env", "teacher", "best_round", "train_wall_s")},
            "train_episodes": None, "overrides": overrides}


def _train_variant(cfg, setting: str, key: str, out: Path) -> dict:
    var = cfg.variants[key]
    if var.get("trainer", "train") == "improve":
        return _train_distilled_variant(cfg, setting, key, out)
    agent = var.get("agent") or cfg.agent
    overrides = train_overrides(cfg, setting, key)
    tcfg = _with_workload(cfg, compose("train", overrides))
    res = train(tcfg, out=out, leave_bars=False)
    env = to_container(tcfg.env)
    return {"model": str(res["model_path"]), "kind": agent, "train_wall_s": res["train_wall_s"],
            "train_episodes": len(res["history"]), "overrides": overrides,
            "env": {k: env[k] for k in ("action", "obs") if k in env}}


def reproduce_setting(cfg, setting: str, out: Path, bar=None) -> dict:
    """Train the variants of ``setting`` (or reuse ``models_from``), evaluate, tabulate;
    ``bar`` (a progress bar over the run's stages) advances once per variant and evaluation.
    The options were checked by ``check_reproduce_options`` (``reproduce`` does it first)."""
    t0 = time.perf_counter()
    trained: dict[str, dict] = {}
    for key in cfg.run_variants:
        run = Path(cfg.models_from) / setting / key if cfg.models_from else None
        if run is not None and key not in list(cfg.get("retrain") or []) and run.exists():
            rec = json.loads((run / "variant.json").read_text()) if (run / "variant.json").exists() else {}
            kind = rec.get("kind") or cfg.variants[key].get("agent") or cfg.agent
            model = rec["model"] if kind == "distilled" else str(_model_path(run, kind))
            trained[key] = {**rec, "model": model, "train_wall_s": rec.get("train_wall_s")}
        else:
            if bar is not None:
                bar.set_postfix_str(f"{setting}: train {key}")
            trained[key] = _train_variant(cfg, setting, key, out / key)
            (out / key / "variant.json").write_text(json.dumps(trained[key], indent=2, default=str))
        if bar is not None:
            bar.update()
    t_train = time.perf_counter() - t0

    ecfg = eval_config(cfg, setting, trained)
    kw = env_kwargs(ecfg)
    t1 = time.perf_counter()
    if bar is not None:
        bar.set_postfix_str(f"{setting}: evaluate")
    ev = evaluate(ecfg, out=out / "eval", leave_bars=False)
    t_eval = time.perf_counter() - t1
    if bar is not None:
        bar.update()
    mu = capacity_rps(kw, int(cfg.eval_seed))
    rate = offered_rate_rps(kw, int(cfg.eval_seed))
    paper_key = cfg.paper_as.get(setting, setting) if cfg.get("paper_as") else setting
    paper = to_container(cfg.paper.get(paper_key)) or {}
    wait = to_container(cfg.paper_router_wait.get(paper_key)) or {}
    labels = {k: cfg.variants[k].label for k in trained}
    table = paper_table(ev["rows"], labels, paper, wait)
    if ev.get("warning"):
        table = ev["warning"] + "\n\n" + table
    n_eps = len({r["seed"] for r in ev["rows"]})
    train_eps = {k: v.get("train_episodes") for k, v in trained.items()}
    train_walls = {k: round(v["train_wall_s"]) for k, v in trained.items() if v.get("train_wall_s")}
    eng = kw["engine"]
    header = (f"### {setting}\n\n{kw['num_instances']} instances, {eng.get('preset')}"
              f"{', chunked prefill' if eng.get('chunked_prefill') else ''}"
              f"{', num_kv_blocks ' + str(eng['num_kv_blocks']) if eng.get('num_kv_blocks') else ''}, "
              f"workload {ev.get('workload', kw['workload'].get('name'))}, {kw['num_requests']} requests per episode; "
              f"offered {rate:.1f} req/s, measured capacity {mu:.2f} req/s, load factor {rate / mu:.2f}. "
              f"Agent {cfg.agent}, training episodes per variant {train_eps}, training wall (s) {train_walls}"
              f"{' (models from ' + str(cfg.models_from) + ' where present)' if cfg.models_from else ''}; "
              f"evaluation: {n_eps} episodes, seeds {cfg.eval_seed}..{int(cfg.eval_seed) + n_eps - 1}, "
              f"identical for every router. Paper numbers: {paper_key}. "
              f"Wall: training {t_train:.0f} s, evaluation {t_eval:.0f} s.")
    text = header + "\n\n" + table + "\n"
    (out / "table.md").write_text(text)
    say(text)
    return {"setting": setting, "workload": ev["workload"], "table": text, "capacity_rps": mu,
            "offered_rps": rate,
            "load_factor": rate / mu, "trained": trained, "train_wall_s": t_train, "eval_wall_s": t_eval,
            "eval": ev}


def transfer_setting(cfg, spec, results: list[dict], out: Path) -> dict:
    """A trained variant on another instance count (its network runs on any m): the setting with
    ``num_instances`` and the arrival rate scaled by the same factor (the same load factor),
    against the heuristics there."""

    src = next((r for r in results if r["setting"] == spec.setting), None)
    if src is None or spec.variant not in src["trained"]:
        from llm_lb_gym._validate import ConfigError

        raise ConfigError(f"transfer: {spec.setting}/{spec.variant} was not trained in this run; "
                          f"settings {[r['setting'] for r in results]}")
    ecfg = _with_workload(cfg, compose("evaluate", [_experiment(cfg, spec.setting), f"seed={cfg.eval_seed}"]))
    with open_dict(ecfg):
        exp_eval = ecfg.get("eval") or {}
        factor = int(spec.num_instances) / int(ecfg.env.num_instances)
        ecfg.env.num_instances = int(spec.num_instances)
        ecfg.env.arrival_rate_rps = float(ecfg.env.arrival_rate_rps) * factor
        ecfg.env.num_requests = int(int(ecfg.env.num_requests) * factor)
        ecfg.episodes = int(spec.get("episodes") or exp_eval.get("episodes", 10))
        ecfg.policies = list(spec.policies)
        ecfg.plot = False
        tr = src["trained"][spec.variant]
        ecfg.agents = {f"{spec.variant}_m{spec.num_instances}": {
            "kind": tr.get("kind") or cfg.agent, "path": tr["model"], "env": tr.get("env") or {}, "any_instances": True}}
        ecfg.env.setdefault("max_episode_steps", STEPS_PER_REQUEST_LIMIT * int(ecfg.env.num_requests))
        ecfg.progress = bool(cfg.get("progress", True))
    t0 = time.perf_counter()
    ev = evaluate(ecfg, out=out / f"transfer_{spec.setting}_{spec.variant}_m{spec.num_instances}")
    labels = {f"{spec.variant}_m{spec.num_instances}":
              f"{cfg.variants[spec.variant].label}, trained on {int(ecfg.env.num_instances / factor)}"}
    text = (f"### {spec.setting} on {spec.num_instances} instances ({ecfg.env.arrival_rate_rps:g} req/s, "
            f"{ecfg.env.num_requests} requests): {spec.variant} trained on {int(ecfg.env.num_instances / factor)} "
            f"instances\n\n{paper_table(ev['rows'], labels, {}, {})}\n\nWall {time.perf_counter() - t0:.0f} s.\n")
    say(text)
    return {"setting": f"{spec.setting}_m{spec.num_instances}", "table": text}


def reproduce(cfg, out: Path | None = None) -> dict:
    """Every setting of ``cfg.settings``; writes ``reproduction.md`` and ``reproduction.json``."""
    import torch

    torch.set_num_threads(1)
    check_reproduce_options(cfg)   # every setting, variant and transfer entry, before any training
    out = Path(out) if out is not None else run_dir(cfg)
    write_run_record(out, cfg)
    t0 = time.perf_counter()
    stages = len(cfg.settings) * (len(cfg.run_variants) + 1)
    with progress_bar(stages, "reproduce", cfg.get("progress", True), unit="stage") as bar:
        results = [reproduce_setting(cfg, s, out / s, bar) for s in cfg.settings]
    results += [transfer_setting(cfg, spec, results, out) for spec in (cfg.get("transfer") or [])]
    wall = time.perf_counter() - t0
    text = "\n".join(r["table"] for r in results) + f"\nTotal wall time {wall:.0f} s.\n"
    (out / "reproduction.md").write_text(text)
    (out / "reproduction.json").write_text(json.dumps(
        [{k: v for k, v in r.items() if k not in ("eval", "table")} for r in results], indent=2, default=str))
    if cfg.get("figures", True):
        for path in reproduce_figures(out, out):
            print(f"figure: {path}")
    print(f"reproduction: {out / 'reproduction.md'} (wall {wall:.0f} s)")
    return {"results": results, "out": out, "wall_s": wall}


@hydra_main("reproduce")
def main(cfg) -> None:
    reproduce(cfg)


if __name__ == "__main__":
    main()
