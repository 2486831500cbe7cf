"""Conditions, suites, the paired runner and the report (llm_lb_gym/suite), and llm-lb-gym benchmark."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.suite.condition import Condition, native_rate_rps
from llm_lb_gym.suite.report import SuiteResult, aggregate_table, condition_table
from llm_lb_gym.suite.runner import PolicySpec, run_episodes
from llm_lb_gym.suite.suites import HELDOUT, SMOKE, TRAIN, Suite, check_disjoint, get_suite

TINY = Condition("task_mix", load=1.3, accuracy=0.79, cluster="2xV100", requests_per_instance=40)


def test_condition_errors_name_the_option_and_allowed_values():
    with pytest.raises(ConfigError, match="condition.workload.*allowed"):
        Condition("tpc")
    with pytest.raises(ConfigError, match="condition.split='test': workload 'task_mix' has no rows"):
        Condition("task_mix", "test")
    with pytest.raises(ConfigError, match="condition.accuracy"):
        Condition("task_mix", accuracy=0.0)
    with pytest.raises(ConfigError, match="condition.accuracy"):
        Condition("task_mix", accuracy=1.2)
    with pytest.raises(ConfigError, match="condition.cluster.*allowed.*4xV100"):
        Condition("task_mix", cluster="4xH200")
    with pytest.raises(ConfigError, match="unknown suite 'held'; allowed: accuracy, heldout, smoke, synthetic"):
        get_suite("held")


def test_heldout_never_replays_training_rows():
    check_disjoint(HELDOUT, TRAIN)
    leak = Suite("leak", (Condition("sharegpt", "train", load=1.0),))
    with pytest.raises(ConfigError, match="replays rows that training draws \\(sharegpt:train\\); allowed for sharegpt: split='test'"):
        check_disjoint(leak, TRAIN)
    whole = Suite("whole", (Condition("azure_conv", "all", load=1.0),))
    with pytest.raises(ConfigError, match="overlap|replays rows"):
        check_disjoint(whole, TRAIN)
    # held-out task-mix conditions sit outside the training space
    for c in HELDOUT.conditions:
        if c.workload == "task_mix":
            assert (c.cluster not in dict(TRAIN.clusters)
                    or not TRAIN.accuracy[0] <= c.accuracy <= TRAIN.accuracy[1])


def test_load_is_a_multiple_of_the_measured_capacity():
    kw = TINY.env_kwargs()
    from llm_lb_gym.suite.condition import measured_capacity_rps
    cap = measured_capacity_rps("task_mix", "all", "2xV100", TINY.num_requests)
    assert kw["arrival_rate_rps"] == pytest.approx(1.3 * cap)
    assert kw["num_instances"] == 2 and kw["num_requests"] == 80
    assert kw["predictor"]["accuracy"] == 0.79 and native_rate_rps("task_mix", "all") is None
    assert Condition("task_mix", accuracy=None).predictor() == "oracle"


def test_space_sampling_is_seeded_and_inside_its_ranges():
    a = TRAIN.sample(np.random.default_rng(4), 30)
    assert a == TRAIN.sample(np.random.default_rng(4), 30)
    for c in a:
        assert TRAIN.load[0] <= c.load <= TRAIN.load[1]
        assert TRAIN.accuracy[0] <= c.accuracy <= TRAIN.accuracy[1]
        assert (c.workload, c.split) in TRAIN.rows_used()


def _rows(values: dict) -> list[dict]:
    """values: policy -> condition -> list of (mean_e2e, p99_ttft, slo) per seed."""
    rows = []
    for p, by_c in values.items():
        for c, seeds in by_c.items():
            for s, (e2e, ttft, slo) in enumerate(seeds):
                rows.append({"condition": c, "policy": p, "kind": "trained" if p == "t" else "heuristic",
                             "seed": s, "mean_e2e_s": e2e, "p99_e2e_s": e2e, "p99_ttft_s": ttft,
                             "slo_attainment_pct": slo, "goodput_rps": 1.0})
    return rows


def test_report_by_hand():
    rr = {"A": [(10.0, 1.0, 60.0), (10.0, 1.0, 60.0)], "B": [(20.0, 2.0, 50.0), (20.0, 2.0, 50.0)]}
    h = {"A": [(9.0, 1.05, 59.0), (9.0, 1.05, 59.0)], "B": [(19.0, 3.0, 50.0), (19.0, 3.0, 50.0)]}
    t = {"A": [(8.0, 1.0, 57.0), (8.05, 1.0, 57.0)], "B": [(16.0, 2.1, 49.0), (16.1, 2.1, 49.0)]}
    res = SuiteResult(_rows({"round_robin": rr, "h": h, "t": t}))
    m, half = res.change("A", "h")
    assert m == pytest.approx(math.log(0.9)) and half == 0.0
    assert res.meets("A", "h") and not res.meets("B", "h")       # p99 TTFT 3.0 > 1.1 x 2.0
    assert not res.meets("A", "t")                                # SLO 57 < 60 - 2
    assert res.meets("B", "t")
    assert res.best_heuristic("A") == "h" and res.best_heuristic("A", constrained=True) == "h"
    assert res.best_heuristic("B", constrained=True) == "round_robin"
    agg = {r["policy"]: r for r in res.aggregate_rows()}
    expect = np.mean([np.mean(np.log([0.8, 0.805])), np.mean(np.log([0.8, 0.805]))])
    assert agg["t"]["log_change"] == pytest.approx(expect)
    assert agg["t"]["wins"] == 2 and agg["t"]["conditions_meeting"] == 1
    assert agg["h"]["p99_ttft_ratio"] == pytest.approx(math.sqrt(1.05 * 1.5))
    assert "| t | trained |" in aggregate_table(res) and "best heuristic: h" in condition_table(res, "A")
    assert res.best("trained", constrained=False) == "t"


def test_runner_is_paired_deterministic_and_worker_independent():
    pols = [PolicySpec("round_robin", "round_robin"), PolicySpec("lb", "late_binding"),
            PolicySpec("lb@oracle", "late_binding", kind="clairvoyant")]
    jobs = [(TINY, p, s) for p in pols for s in (1000, 1001)]
    a = run_episodes(jobs, workers=1)
    b = run_episodes(jobs, workers=2)
    assert a == b
    assert all(r["completed"] + r["rejected"] == 80 and r["unfinished"] == 0 for r in a)
    lb = [r["mean_e2e_s"] for r in a if r["policy"] == "lb"]
    orc = [r["mean_e2e_s"] for r in a if r["policy"] == "lb@oracle"]
    assert lb != orc            # the clairvoyant row really plays with other predictions


def test_benchmark_command_smoke(tmp_path):
    from llm_lb_gym.experiments._hydra import compose
    from llm_lb_gym.experiments.benchmark import benchmark

    cfg = compose("benchmark", ["suite=smoke", "seeds=2", "workers=1", "progress=false",
                                "heuristics=[round_robin,least_requests,late_binding]",
                                "clairvoyant=[late_binding]"])
    out = benchmark(cfg, out=tmp_path, log=lambda *_: None)
    text = (tmp_path / "summary.md").read_text()
    assert "## Aggregate over the conditions" in text and "late_binding@oracle" in text
    assert (tmp_path / "results.csv").exists() and (tmp_path / "aggregate.json").exists()
    assert len(out["result"].rows) == len(SMOKE.conditions) * 2 * 5


@pytest.mark.parametrize("override, match", [
    ("heuristics=[least_requests]", "must include round_robin"),
    ("heuristics=[round_robin,rr2]", "benchmark.heuristics\\[\\]"),
    ("clairvoyant=[nope]", "benchmark.clairvoyant lists 'nope'"),
    ("suite=nope", "unknown suite 'nope'"),
    ("+trained.x={router: scored_binding, options: {hedge: 3}}", "hedge"),
    ("missing_data=ignore", "benchmark.missing_data"),
])
def test_benchmark_checks_its_options_before_any_episode(tmp_path, override, match):
    from llm_lb_gym.experiments._hydra import compose
    from llm_lb_gym.experiments.benchmark import benchmark

    cfg = compose("benchmark", ["suite=smoke", "workers=1", override])
    with pytest.raises(ConfigError, match=match):
        benchmark(cfg, out=tmp_path, log=lambda *_: None)
    assert not (tmp_path / "results.csv").exists()


def test_condition_env_draws_conditions_with_fixed_spaces():
    import dataclasses

    from gymnasium.utils.env_checker import check_env

    from llm_lb_gym.suite.env import ConditionEnv
    from llm_lb_gym.suite.suites import TRAIN_SYNTHETIC

    space = dataclasses.replace(TRAIN_SYNTHETIC, requests_per_instance=20)
    env = ConditionEnv(space, num_instances=4)
    assert "speed" in env.env_options["obs"]["features"]       # the mixed 2+2 cluster is drawn too
    names = []
    for s in range(6):
        obs, info = env.reset(seed=s)
        assert env.observation_space.contains(obs)
        names.append(info["condition"])
    assert len(set(names)) > 1
    again = ConditionEnv(space, num_instances=4)
    assert [again.reset(seed=s)[1]["condition"] for s in range(6)] == names
    o1, _ = env.reset(seed=3)
    o2, _ = again.reset(seed=3)
    assert np.array_equal(o1, o2)
    check_env(ConditionEnv(space, num_instances=2), skip_render_check=True)
    with pytest.raises(ConfigError, match="num_instances=3; allowed: 2, 4, 8"):
        ConditionEnv(space, num_instances=3)
    with pytest.raises(ConfigError, match="env_options.workload is set by each condition"):
        ConditionEnv(space, env_options={"workload": "task_mix"})


def test_robust_main_job_tiny_trains_then_benchmarks_the_found_router(tmp_path, monkeypatch):
    """``llm-lb-gym robust`` in miniature: the search over the task-mix training space (episodes of
    30 requests per instance here), its options written, then the benchmark with the found router
    as a trained row under its label; the same seed gives the same options."""
    import dataclasses

    import yaml

    import llm_lb_gym.suite.suites as suites
    from llm_lb_gym.experiments._hydra import compose
    from llm_lb_gym.experiments.robust import robust

    monkeypatch.setattr(suites, "TRAIN_SYNTHETIC", dataclasses.replace(suites.TRAIN_SYNTHETIC,
                                                                       requests_per_instance=30))
    over = ["search.conditions=train_synthetic", "search.generations=1", "search.population=2",
            "search.conditions_per_generation=1", "search.validation_episodes=1", "search.workers=1",
            "search.params=[growth_frac,hedge]", "benchmark.suite=smoke", "benchmark.seeds=1",
            "benchmark.workers=1", "benchmark.heuristics=[round_robin,late_binding]", "label=mine"]
    a = robust(compose("robust", over), out=tmp_path / "a", log=lambda *_: None)
    found = yaml.safe_load((tmp_path / "a" / "scored_binding.yaml").read_text())["scored_binding"]
    assert found == a["summary"]["found_options"]
    rows = a["benchmark"]["result"].rows
    assert {r["policy"] for r in rows} == {"round_robin", "late_binding", "mine"}
    assert "mine" in (tmp_path / "a" / "benchmark" / "summary.md").read_text()
    b = robust(compose("robust", over), out=tmp_path / "b", log=lambda *_: None)
    assert b["summary"]["found_options"] == found


def test_robust_checks_its_label_before_the_search(tmp_path):
    from llm_lb_gym.experiments._hydra import compose
    from llm_lb_gym.experiments.robust import robust

    with pytest.raises(ConfigError, match="label='late_binding' is already a row of the benchmark"):
        robust(compose("robust", ["label=late_binding", "benchmark.suite=smoke"]), out=tmp_path,
               log=lambda *_: None)
    assert not (tmp_path / "search.json").exists()


def test_registered_training_distribution_env_for_any_framework(tmp_path, monkeypatch):
    """``gym.make("LLMCluster-TrainSynthetic-v0")``: a fresh training condition per reset, every
    request accounted for, the final metrics, RouterRL on top; ``LLMCluster-Train-v0`` without
    the data says which dataset and what runs without it; an unknown space is named."""
    import gymnasium as gym

    import llm_lb_gym
    from llm_lb_gym.envs.wrappers import RouterRL
    from llm_lb_gym.suite.env import ConditionEnv

    assert set(llm_lb_gym.CONDITION_ENV_IDS) <= set(gym.registry)
    env = gym.make("LLMCluster-TrainSynthetic-v0", num_instances=2)
    obs, info = env.reset(seed=3)
    first = info["condition"]
    done, steps = False, 0
    while not done:
        obs, _, term, trunc, info = env.step(env.action_space.sample(mask=info["action_mask"]))
        done, steps = term or trunc, steps + 1
    m = info["metrics"]
    assert term and m["completed"] + m["rejected"] == m["num_requests"] == 600
    assert gym.make("LLMCluster-TrainSynthetic-v0", num_instances=2).reset(seed=3)[1]["condition"] == first
    wrapped = RouterRL(gym.make("LLMCluster-TrainSynthetic-v0", num_instances=2))
    _, winfo = wrapped.reset(seed=1)
    assert wrapped.observation_space.contains(wrapped.reset(seed=1)[0]) and "condition" in winfo
    with pytest.raises(ConfigError, match="condition space 'nope' is unknown; allowed: train, train_synthetic"):
        ConditionEnv("nope")
    empty = tmp_path / "data"
    empty.mkdir()
    monkeypatch.setenv("LLM_LB_GYM_DATA", str(empty))
    with pytest.raises(ConfigError, match="train draws sharegpt:train, which is not here .*space='train_synthetic'"):
        gym.make("LLMCluster-Train-v0")


def test_benchmark_plays_a_trained_network_on_the_suites_episodes(tmp_path):
    """``benchmark.trained.net.model``: an ``llm-lb-gym improve`` run's network plays every
    condition of the suite (its own action/observation options, the condition's cluster, traffic
    and predictor) on the same seeds as the heuristics; what it cannot play is named before any
    episode; a bad path names the option."""
    pytest.importorskip("torch")
    from test_serve_artifacts import improve_run   # tests/ is on sys.path (rootdir-less layout)

    from llm_lb_gym.experiments._hydra import compose
    from llm_lb_gym.experiments.benchmark import benchmark

    run = tmp_path / "improve"
    run.mkdir()
    improve_run(run)                               # a 2-instance network, output layers random
    over = ["suite=smoke", "seeds=1", "workers=1", "progress=false", "heuristics=[round_robin,late_binding]"]
    cfg = compose("benchmark", over + ["~trained.scored_binding", f"+trained.net={{model: {run}}}"])
    out = benchmark(cfg, out=tmp_path / "a", log=lambda *_: None)
    rows = out["result"].rows
    net = [r for r in rows if r["policy"] == "net"]
    lb = [r for r in rows if r["policy"] == "late_binding"]
    assert len(net) == len(SMOKE.conditions) and all(r["kind"] == "trained" for r in net)
    assert all(r["completed"] + r["rejected"] == r["num_requests"] for r in net)
    assert [r["mean_e2e_s"] for r in net] != [r["mean_e2e_s"] for r in lb]   # it decides itself
    assert "| net | trained |" in (tmp_path / "a" / "summary.md").read_text()
    from llm_lb_gym.experiments._benchmark import NetworkPlayer
    from llm_lb_gym.suite.runner import condition_kwargs

    mixed = Condition("task_mix", load=1.0, accuracy=0.79, cluster="2xA100+2xV100", requests_per_instance=20)
    with pytest.raises(ConfigError, match="the network cannot play condition 'task_mix 1x acc0.79 2xA100"):
        NetworkPlayer("net", str(run)).check(mixed, condition_kwargs(mixed, "trained"))
    with pytest.raises(ConfigError, match="benchmark.trained.net.model: .*does not exist"):
        benchmark(compose("benchmark", over + [f"+trained.net={{model: {tmp_path / 'nowhere'}}}"]),
                  out=tmp_path / "b", log=lambda *_: None)
