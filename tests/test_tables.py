"""Result tables account for every request and name the workload replayed (issue 10, item 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from llm_lb_gym.experiments._accounting import describe_workload, loss_warning
from llm_lb_gym.experiments.evaluate import evaluate, summarize
from llm_lb_gym.experiments.load_sweep import _sweep_table
from llm_lb_gym.experiments.reproduce import paper_table
from llm_lb_gym.envs.builders import build_workload


def _row(policy, seed, completed, rejected, unfinished, n=100, e2e=2.0):
    return {"policy": policy, "seed": seed, "num_requests": n, "completed": completed,
            "rejected": rejected, "unfinished": unfinished, "mean_e2e_s": e2e, "p99_e2e_s": 5.0,
            "mean_ttft_s": 0.1, "p99_ttft_s": 0.5, "mean_tbt_s": 0.03, "p99_tbt_s": 0.05,
            "preemptions": 0, "mean_router_wait_s": 0.01}


def _cells(table: str, first: str) -> dict[str, str]:
    """The row whose first cell is ``first``, keyed by the header's titles."""
    lines = table.splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    row = next(line for line in lines if line.startswith(f"| {first} |"))
    return dict(zip(head, [c.strip() for c in row.strip("|").split("|")]))


def test_summary_has_completed_rejected_unfinished_per_episode():
    rows = [_row("round_robin", 0, 100, 0, 0), _row("round_robin", 1, 98, 2, 0),
            _row("agent", 0, 90, 0, 10), _row("agent", 1, 99, 0, 1)]
    table = summarize(rows, "round_robin")
    rr = _cells(table, "round_robin")
    ag = _cells(table, "agent")
    assert (rr["completed"], rr["rejected"], rr["unfinished"]) == ("99", "1", "0")
    assert (ag["completed"], ag["rejected"], ag["unfinished"]) == ("94.5", "0", "5.5")
    assert len({line.count("|") for line in table.splitlines()}) == 1   # a well-formed table


def test_loss_warning_above_one_percent_only():
    assert loss_warning([_row("rr", 0, 99, 1, 0)]) is None              # exactly 1%: quiet
    warn = loss_warning([_row("rr", 0, 33, 67, 0), _row("jsq", 0, 99, 0, 1),
                         _row("agent", 0, 97, 1, 2)])
    assert warn.startswith("**WARNING") and "rr 67.0% rejected, 0.0% unfinished" in warn
    assert "agent 1.0% rejected, 2.0% unfinished" in warn and "jsq" not in warn


def test_paper_and_sweep_tables_carry_the_counts():
    rows = [_row("round_robin", 0, 95, 5, 0), _row("wg_rl", 0, 90, 5, 5)]
    table = paper_table(rows, {"wg_rl": "WG-RL"}, {"wg_rl": 11.43}, {})
    wg = _cells(table, "WG-RL")
    assert (wg["completed"], wg["rejected"], wg["unfinished"]) == ("90", "5", "5")
    sweep = _sweep_table([(0.5, 10.0, {"rows": rows})], "round_robin")
    cells = _cells(sweep, "0.5")
    assert (cells["completed"], cells["rejected"], cells["unfinished"]) == ("92.5", "5", "2.5")
    assert len({line.count("|") for line in sweep.splitlines()}) == 1


def _long_context_trace(tmp_path, n=60):
    """Two thirds of the prompts exceed a 4,096-token context: they are rejected at arrival."""
    path = tmp_path / "long_context.jsonl"
    path.write_text("".join(
        json.dumps({"timestamp": 100 * i, "input_length": 6000 if i % 3 else 300,
                    "output_length": 40}) + "\n" for i in range(n)))
    return path


def _eval_cfg(tmp_path, workload, **env):
    return OmegaConf.create({
        "env": {"num_instances": 2, "num_requests": 30, **env},
        "engine": {"preset": "llama2-7b-v100"}, "workload": workload,
        "predictor": {"name": "oracle"}, "reward": {"mode": "baseline"},
        "policies": ["round_robin", "jsq"], "episodes": 2, "seed": 0, "baseline": "round_robin",
        "plot": False, "output_dir": str(tmp_path)})


def test_evaluate_warns_on_rejections_and_names_the_trace(tmp_path, capsys):
    path = _long_context_trace(tmp_path)
    workload = {"name": "trace", "path": str(path), "format": "mooncake", "rate_scale": 2.0,
                "start": "head"}
    ev = evaluate(_eval_cfg(tmp_path, workload), out=tmp_path / "eval")
    text = (tmp_path / "eval" / "summary.md").read_text()
    assert f"trace {path} (mooncake) at rate_scale 2" in text
    assert "**WARNING: more than 1% of requests were not completed**" in text
    assert "round_robin 66.7% rejected" in text and ev["warning"] in capsys.readouterr().out
    rr = _cells(ev["table"], "round_robin")
    assert (rr["completed"], rr["rejected"], rr["unfinished"]) == ("10", "20", "0")


class _Deferrer:
    """An 'agent' that always defers (action m = 2 here): with ``action.masked="as_taken"`` it
    is cut by the step limit (the default ``fallback`` would route its masked defers)."""

    def predict(self, observation, deterministic=True):
        return np.array(2), None


def test_evaluate_counts_requests_left_at_the_step_limit(tmp_path, monkeypatch):
    import llm_lb_gym.agents.factory

    monkeypatch.setattr(llm_lb_gym.agents.factory, "load_agent", lambda kind, path, env=None: _Deferrer())
    cfg = _eval_cfg(tmp_path, {"name": "task_mix"}, max_episode_steps=8,
                    action={"masked": "as_taken"})   # its defers taken as given (no fallback)
    cfg.agents = {"deferrer": {"kind": "dqn", "path": "unused"}}
    ev = evaluate(cfg, out=tmp_path / "eval")
    cells = _cells(ev["table"], "deferrer")
    assert cells["completed"] == "0" and cells["unfinished"] == "30"
    assert "deferrer 0.0% rejected, 100.0% unfinished" in ev["warning"]
    assert "round_robin" not in ev["warning"]
    assert "task mix, Poisson 20 req/s" in (tmp_path / "eval" / "summary.md").read_text()


def test_clean_evaluation_has_no_warning(tmp_path):
    ev = evaluate(_eval_cfg(tmp_path, {"name": "task_mix"}, arrival_rate_rps=5.0),
                  out=tmp_path / "eval")
    assert ev["warning"] is None and "WARNING" not in (tmp_path / "eval" / "summary.md").read_text()


@pytest.mark.parametrize("spec,want", [
    ({"name": "task_mix", "arrival": "gamma", "rate_rps": 7.0, "cv": 2.0}, "task mix, gamma 7 req/s, cv 2"),
    ("task_mix", "task mix, Poisson 3 req/s"),
])
def test_describe_workload(spec, want):
    assert describe_workload(build_workload(spec, 3.0)) == want


def test_prefix_columns_read_na_without_caching_and_percent_with_it():
    off = [{**_row("rr", s, 100, 0, 0), "prefix_caching": 0.0, "prefix_hit_rate": 0.0,
            "prefix_saved_tokens": 0} for s in (0, 1)]
    on = [{**_row("rr", s, 100, 0, 0), "prefix_caching": 1.0, "prefix_hit_rate": h,
           "prefix_saved_tokens": 10} for s, h in ((0, 0.25), (1, 0.5))]
    assert (lambda c: (c["prefix hit rate"], c["prefill tokens saved"]))(
        _cells(summarize(off, "rr"), "rr")) == ("n/a", "n/a")
    assert (lambda c: (c["prefix hit rate"], c["prefill tokens saved"]))(
        _cells(summarize(on, "rr"), "rr")) == ("37.5%", "10")
