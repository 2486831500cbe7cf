"""``llm_lb_gym.experiments.merge`` over a sweep of settings: the baseline differs per job, so each job's
policies are compared with that job's baseline (before: every "vs round_robin" cell was n/a)."""

from __future__ import annotations

import csv
import json

import pytest

pytest.importorskip("omegaconf", reason="experiments need the rl extra")

from llm_lb_gym.experiments.merge import merge  # noqa: E402

COLUMNS = ("mean_e2e_s", "p99_e2e_s", "mean_ttft_s", "p99_ttft_s", "mean_tbt_s", "p99_tbt_s",
           "preemptions", "mean_router_wait_s")


def _row(policy, seed, e2e):
    return {"policy": policy, "seed": seed, **{k: e2e for k in COLUMNS}, "preemptions": 0,
            "num_requests": 10, "completed": 10, "rejected": 0, "unfinished": 0,
            "prefix_hit_rate": "", "prefix_saved_tokens": "", "slo_attainment_pct": 90.0,
            "goodput_rps": 1.0, "wall_s": 0.1}


def _job(sweep, n, rate, rows):
    job = sweep / str(n)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(f"- env.arrival_rate_rps={rate}\n- episodes=2\n")
    (job / "run.json").write_text(json.dumps({"seed": 1000}))
    with open(job / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_a_settings_sweep_compares_each_job_with_its_own_baseline(tmp_path):
    sweep = tmp_path / "sweep"
    # rate 20: jsq -10% on both episodes; rate 40 (other episodes, other numbers): jsq -50%
    _job(sweep, 0, 20, [_row("round_robin", 1000, 10.0), _row("round_robin", 1001, 20.0),
                        _row("jsq", 1000, 9.0), _row("jsq", 1001, 18.0)])
    _job(sweep, 1, 40, [_row("round_robin", 1000, 40.0), _row("round_robin", 1001, 60.0),
                        _row("jsq", 1000, 20.0), _row("jsq", 1001, 30.0)])
    text = merge(sweep)["results.csv"].read_text()
    assert "one table per job" in text
    tables = text.split("### ")[1:]
    assert [t.splitlines()[0] for t in tables] == ["env.arrival_rate_rps=20", "env.arrival_rate_rps=40"]
    for table, change in zip(tables, ("-10.00%", "-50.00%")):
        jsq = next(line for line in table.splitlines() if line.startswith("| jsq |"))
        rr = next(line for line in table.splitlines() if line.startswith("| round_robin |"))
        assert change in jsq and "n/a |" not in jsq.split("|")[-3]
        assert "+0.00%" in rr
    across = text.split("Across jobs:")[1]
    jsq = next(line for line in across.splitlines() if line.startswith("| jsq |"))
    assert "-30.00%" in jsq and "-10.00%, -50.00%" in jsq
    assert not any(line.startswith("| round_robin |") for line in across.splitlines())


def test_merge_is_an_llm_lb_gym_command(tmp_path, capsys):
    from llm_lb_gym.experiments import cli

    assert "merge" in cli.COMMANDS
    sweep = tmp_path / "sweep"
    _job(sweep, 0, 20, [_row("round_robin", 1000, 10.0), _row("jsq", 1000, 9.0)])
    _job(sweep, 1, 40, [_row("round_robin", 1000, 40.0), _row("jsq", 1000, 20.0)])
    assert cli.main(["merge", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("results.csv: ") and "### env.arrival_rate_rps=40" in out
    assert (sweep / "merged" / "summary.md").is_file()
    with pytest.raises(SystemExit) as done:
        cli.main(["merge", "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: llm-lb-gym merge")
