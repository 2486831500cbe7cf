"""Search a router's options on whole episodes (evolution strategy over scored_binding), then test it.

    python -m llm_lb_gym.experiments.policy_search                                   # near capacity, mean E2E
    python -m llm_lb_gym.experiments.policy_search experiment=paper_v100_kv_limited  # overloaded
    python -m llm_lb_gym.experiments.policy_search experiment=slo_near_capacity search.objective=slo
    python -m llm_lb_gym.experiments.policy_search search.generations=5 test.episodes=5   # shorter

Runs :func:`llm_lb_gym.agents.policy_search.policy_search` on the setting (``conf/policy_search.yaml``),
writes the found options to ``scored_binding.yaml`` in the run directory (and the command that
evaluates them), logs the generations to TensorBoard (``<run>/tb``), then evaluates the found
router, the start point's late_binding and the listed heuristics on the test seeds
(``llm_lb_gym.experiments._evaluation.evaluate``: identical seeded episodes) and prints the paired % change of mean
E2E against each, with 95% confidence intervals, p99 E2E against round robin's, SLO attainment
(points, paired) where the setting has deadlines, and the search's wall time.
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("rl", "llm-lb-gym policy_search")

import json
import time
from pathlib import Path

import numpy as np

from llm_lb_gym.experiments._entry_options import _names, check_evaluate_options
from llm_lb_gym.experiments._evaluation import evaluate
from llm_lb_gym.experiments._hydra import env_kwargs, hydra_main, run_dir, to_container, write_run_record
from llm_lb_gym.experiments._progress import say
from llm_lb_gym.experiments._tables import paired_change, paired_difference

NAME = "scored_binding"


def search_config(cfg):
    from llm_lb_gym.agents.policy_search import SearchConfig

    return SearchConfig.from_options(to_container(cfg.search))


def test_config(cfg, out: Path, policies: list[str], found: dict):
    """The test evaluation's config (``evaluate``'s keys) with ``found`` as scored_binding's options."""
    from omegaconf import OmegaConf

    options = {**(to_container(cfg.eval.policy_options) or {}), NAME: found}
    return OmegaConf.create({
        "env": to_container(cfg.env), "engine": to_container(cfg.engine),
        "workload": to_container(cfg.workload), "predictor": to_container(cfg.predictor),
        "reward": to_container(cfg.reward), "policies": policies, "policy_options": options,
        "agents": {}, "episodes": cfg.test.get("episodes"), "seed": cfg.test.get("seed"),
        "baseline": "round_robin", "plot": True, "output_dir": str(out / "test"),
        "progress": cfg.get("progress", True)})


def _by_seed(rows: list[dict], policy: str, base: str, key: str):
    a = {r["seed"]: r[key] for r in rows if r["policy"] == policy}
    b = {r["seed"]: r[key] for r in rows if r["policy"] == base}
    seeds = sorted(set(a) & set(b))
    return np.array([a[s] for s in seeds], np.float64), np.array([b[s] for s in seeds], np.float64)


def search(cfg, out: Path | None = None) -> dict:
    import yaml
    from torch.utils.tensorboard import SummaryWriter

    from llm_lb_gym.agents.policy_search import check_setting, policy_search, start_options

    out = Path(out) if out is not None else run_dir(cfg)
    sc = search_config(cfg)
    kw = env_kwargs(cfg)
    # The test's options too, before the search (it runs after it).
    policies = list(dict.fromkeys([*_names("test.policies", to_container(cfg.test.get("policies"))), NAME]))
    check_evaluate_options(test_config(cfg, out, policies, start_options(sc.start).as_dict()), prefix="test.")
    check_setting(kw, sc)
    out.mkdir(parents=True, exist_ok=True)
    write_run_record(out, cfg)
    writer = SummaryWriter(str(out / "tb" / NAME))
    res = policy_search(kw, sc, log=say, writer=writer)
    writer.close()
    found = res["best_options"].as_dict()
    (out / f"{NAME}.yaml").write_text(yaml.safe_dump({NAME: found}, sort_keys=False))
    ev_cfg = test_config(cfg, out, policies, found)
    t1 = time.perf_counter()
    ev = evaluate(ev_cfg, out=out / "test", leave_bars=False)
    rows = ev["rows"]
    vs_each = {p: paired_change(*_by_seed(rows, NAME, p, "mean_e2e_s")) for p in policies if p != NAME}
    each_vs_rr = {p: paired_change(*_by_seed(rows, p, "round_robin", "mean_e2e_s"))
                  for p in policies if p != "round_robin"}
    p99 = {p: float(np.mean([r["p99_e2e_s"] for r in rows if r["policy"] == p])) for p in policies}
    slo = None
    if all(r.get("slo_attainment_pct") is not None for r in rows):
        slo = {p: paired_difference(*_by_seed(rows, NAME, p, "slo_attainment_pct"))
               for p in policies if p != NAME}
        slo_mean = {p: float(np.mean([r["slo_attainment_pct"] for r in rows if r["policy"] == p]))
                    for p in policies}
    summary = {
        "found_options": found, "best_generation": res["best_generation"],
        "best_val_objective": res["best_val_objective"], "history": res["history"],
        "train_wall_s": round(res["wall_s"], 1), "test_wall_s": round(time.perf_counter() - t1, 1),
        "change_vs_each_pct": vs_each, "change_vs_round_robin_pct": each_vs_rr,
        "mean_p99_e2e_s": p99, "table": ev["table"]}
    if slo is not None:
        summary["slo_vs_each_points"] = slo
        summary["slo_attainment_pct"] = slo_mean
    (out / "search_summary.json").write_text(json.dumps(summary, indent=2))
    say(f"{NAME} (generation {res['best_generation']} of {sc.generations}, objective "
        f"{sc.objective}, searched in {res['wall_s']:.0f} s): {found}")
    say(f"mean E2E vs round robin (paired 95% CI, {int(cfg.test.episodes)} test episodes): "
        + "; ".join(f"{p} {m:+.2f} ± {h:.2f}%" for p, (m, h) in each_vs_rr.items()))
    say(f"{NAME} mean E2E vs each (paired 95% CI): "
        + "; ".join(f"{p} {m:+.2f} ± {h:.2f}%" for p, (m, h) in vs_each.items()))
    ratio = (f"; {NAME} / round_robin = {p99[NAME] / p99['round_robin']:.3f}"
             if "round_robin" in p99 else "")
    say("p99 E2E (mean over episodes): " + "; ".join(f"{p} {v:.2f} s" for p, v in p99.items()) + ratio)
    if slo is not None:
        say("SLO attainment: " + "; ".join(f"{p} {v:.1f}%" for p, v in slo_mean.items()))
        say(f"{NAME} SLO attainment vs each (points, paired 95% CI): "
            + "; ".join(f"{p} {m:+.2f} ± {h:.2f}" for p, (m, h) in slo.items()))
    say(f"evaluate it: python -m llm_lb_gym.experiments.evaluate {' '.join(_setting_overrides())} "
        f"episodes={int(cfg.test.episodes)} seed={int(cfg.test.seed)} "
        f"'policies=[round_robin,late_binding,{NAME}]' "
        f"'policy_options={{{NAME}: {json.dumps(found).replace(chr(34), '')}}}'")
    say(f"run dir {out}; TensorBoard: tensorboard --logdir {out / 'tb'}")
    return {"out": out, "summary": summary, "eval": ev}


def _setting_overrides() -> list[str]:
    """The setting as ``llm_lb_gym.experiments.evaluate`` overrides: the experiment this run composed and
    the command line's group and load overrides."""
    import sys

    keep = ("engine", "workload", "predictor", "env.arrival_rate_rps", "env.num_requests")
    args = [a for a in sys.argv[1:] if a.split("=")[0].lstrip("+") in keep]
    try:
        from hydra.core.hydra_config import HydraConfig

        exp = HydraConfig.get().runtime.choices.get("experiment")
    except Exception:   # outside @hydra.main (tests)
        exp = None
    return ([f"experiment={exp}"] if exp and exp != "null" else []) + args


@hydra_main("policy_search")
def main(cfg) -> float:
    return search(cfg)["summary"]["change_vs_each_pct"].get("late_binding", (float("nan"),))[0]


if __name__ == "__main__":
    main()
