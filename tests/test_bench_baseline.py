"""``python -m llm_lb_gym.experiments.bench`` against its saved baseline: which figures are speeds, which
way is faster, what is flagged, and the saved file's labels. No timing here (figures are
made up); speed itself lives in the benchmark."""

from __future__ import annotations

import json

from llm_lb_gym.experiments.bench import BASELINE_PATH, Report, compare, direction, machine_facts


def test_figure_directions():
    assert direction("fast_requests_per_s") == 1
    assert direction("round_robin_steps_per_wall_s") == 1          # a rate, not a time
    assert direction("round_robin_steps_per_cpu_s_median_episode") == 1
    assert direction("round_robin_cpu_us_per_step") == -1           # "per_step" is not "per_s"
    assert direction("fast_wall_s") == -1
    assert direction("tracemalloc_peak_bytes_per_request_at_5000") == -1
    assert direction("completed") == direction("mean_e2e_s") == direction("round_robin_steps_per_episode") == 0


def test_regressions_beyond_the_tolerance_are_flagged_and_behaviour_changes_noted():
    base = {"section": "env", "figures": {"a_steps_per_cpu_s": 100.0, "b_cpu_us_per_step": 10.0,
                                          "c_steps_per_cpu_s": 100.0, "completed": 2000}}
    now = {"a_steps_per_cpu_s": 80.0,      # 0.80x: slower by 25%
           "b_cpu_us_per_step": 10.5,       # 0.95x: within 15%
           "c_steps_per_cpu_s": 130.0,      # faster
           "completed": 1999}
    notes, bad = compare(now, base, tolerance=0.15)
    assert bad == ["env: a_steps_per_cpu_s 0.80x"]
    assert "REGRESSION" in notes["a_steps_per_cpu_s"]
    assert notes["b_cpu_us_per_step"].endswith("0.95x") and notes["c_steps_per_cpu_s"].endswith("1.30x")
    assert "differs" in notes["completed"]
    assert compare(now, None, 0.15) == ({}, [])


def test_save_labels_the_figures_and_keeps_other_parts(tmp_path, capsys):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"simulator": {"package_version": "0.4.0", "figures": {"x": 1.0}}}))
    rep = Report(path, 0.15, "python -m llm_lb_gym.experiments.bench env", machine_facts())
    rep.section("LLMCluster-v0", "env", {"round_robin_steps_per_cpu_s": 40000.0})
    rep.save()
    saved = json.loads(path.read_text())
    assert saved["simulator"]["package_version"] == "0.4.0"          # not run: kept
    env = saved["env"]
    from llm_lb_gym import __version__
    assert env["package_version"] == __version__ and env["command"] == "python -m llm_lb_gym.experiments.bench env"
    assert {"cpu", "cores", "python", "engine", "load_average_1min_at_start"} <= set(env["machine"])
    again = Report(path, 0.15, "python -m llm_lb_gym.experiments.bench env", machine_facts())
    again.section("LLMCluster-v0", "env", {"round_robin_steps_per_cpu_s": 20000.0})
    again.summary()
    out = capsys.readouterr().out
    assert "0.50x  REGRESSION" in out and "REGRESSIONS beyond 15%" in out


def test_the_committed_baseline_is_labelled():
    saved = json.loads(BASELINE_PATH.read_text())
    assert {"simulator", "env"} <= set(saved)
    for part in saved.values():
        assert part["package_version"] and part["saved_utc"] and part["command"].startswith("python -m llm_lb_gym.experiments.bench")
        assert part["machine"]["engine"] in ("compiled", "pure-python") and part["figures"]
