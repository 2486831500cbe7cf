"""scored_binding (late_binding's parametric family) and the policy search over it.

The family's late_binding point decides exactly as late_binding does, its options are checked
with named errors, each lever changes what happens, and a tiny search is deterministic for a
seed (in one process or two) and never keeps a point worse on validation than its start.
"""

from __future__ import annotations

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs.cluster_env import LLMClusterEnv
from llm_lb_gym.rollout import make_env_router, rollout_router
from llm_lb_gym.routers import make_router
from llm_lb_gym.routers.scored_binding import ScoredBindingOptions

ENV = dict(num_instances=2, num_requests=120, arrival_rate_rps=16.0, engine={"num_kv_blocks": 300})
LB = {"period_s": 0.1, "rounds": "since_release", "reserve": "full", "order": "shortest"}


def outcome(env, name: str, seed: int = 3, **options) -> tuple:
    rollout_router(env, make_env_router(name, env, **options), seed)
    tb = env.cluster.table
    return tuple(tb.column("finish_s").tolist()), tuple(tb.column("instance").tolist())


@pytest.mark.parametrize("lb", [
    LB, {**LB, "reserve": "prompt"}, {**LB, "rounds": "global", "period_s": 0.25},
    {**LB, "rounds": "per_instance", "period_s": 0.3}, {**LB, "period_s": 0.0, "max_wait_s": 1.0},
])
def test_late_binding_point_reproduces_late_binding(lb):
    env = LLMClusterEnv(**ENV)
    sb = ScoredBindingOptions.from_late_binding(lb).as_dict()
    assert outcome(env, "scored_binding", **sb) == outcome(env, "late_binding", **lb)


@pytest.mark.parametrize("lever", [{"growth_frac": 1.0}, {"room_margin": 0.2}, {"age_per_s": 5.0},
                                   {"prompt_weight": 2.0}, {"reserve_frac": 0.5}, {"work_weight": 5.0},
                                   {"seq_cap_frac": 0.02}, {"late_penalty": 20.0}])
def test_every_lever_changes_the_episode(lever):
    env = LLMClusterEnv(**{**ENV, "arrival_rate_rps": 30.0})
    sb = ScoredBindingOptions.from_late_binding(LB).as_dict()
    assert outcome(env, "scored_binding", **{**sb, **lever}) != outcome(env, "scored_binding", **sb)


def test_hedge_reserves_more_where_the_predictor_is_unsure():
    """Direction: hedge 1 counts the upper quantile, so every need is >= hedge 0's, strictly for
    some; with the oracle (upper = true length) it changes nothing."""
    env = LLMClusterEnv(**{**ENV, "predictor": {"name": "noisy", "accuracy": 0.7}})
    env.reset(seed=1)
    tb = env.cluster.table
    base = make_router("scored_binding", reserve_frac=1.0)
    hedged = make_router("scored_binding", reserve_frac=1.0, hedge=1.0)
    needs0 = [base.need_blocks(env.cluster, r) for r in range(tb.n)]
    needs1 = [hedged.need_blocks(env.cluster, r) for r in range(tb.n)]
    assert all(b >= a for a, b in zip(needs0, needs1)) and needs1 != needs0
    bs = env.cluster.engines[0].bs
    r = max(range(tb.n), key=lambda i: tb.pred_hi[i] - tb.pred[i])
    assert needs1[r] == min(-(-(tb.prompt[r] + tb.pred_hi[r]) // bs), env.cluster.engines[0].total_blocks
                            - env.cluster.engines[0].watermark)
    orc = LLMClusterEnv(**{**ENV, "arrival_rate_rps": 30.0, "predictor": "oracle"})
    sb = {**ScoredBindingOptions.from_late_binding(LB).as_dict()}
    assert outcome(orc, "scored_binding", **{**sb, "hedge": 1.0}) == outcome(orc, "scored_binding", **sb)


def test_max_hold_bounds_the_router_wait():
    """Direction: with a KV gate that holds requests for long (room_margin 0.6), max_hold_s
    caps every request's router wait at the bound plus one decision interval."""
    env = LLMClusterEnv(**{**ENV, "arrival_rate_rps": 30.0})
    sb = {**ScoredBindingOptions.from_late_binding(LB).as_dict(), "room_margin": 0.6}
    free = rollout_router(env, make_env_router("scored_binding", env, **sb), 3).metrics
    assert free["max_router_wait_s"] > 2.0
    held = rollout_router(env, make_env_router("scored_binding", env, **{**sb, "max_hold_s": 0.5}), 3).metrics
    assert held["max_router_wait_s"] <= 0.5 + env.cfg.decision_interval_s + 1e-9
    assert held["completed"] + held["rejected"] == ENV["num_requests"]
    with pytest.raises(ConfigError, match=r"router\.scored_binding\.max_hold_s"):
        ScoredBindingOptions(max_hold_s=0.0)
    with pytest.raises(ConfigError, match=r"router\.scored_binding\.hedge"):
        ScoredBindingOptions(hedge=-0.1)


def test_options_are_validated_with_named_errors():
    with pytest.raises(ConfigError, match=r"router\.scored_binding\.reserve_frac"):
        ScoredBindingOptions(reserve_frac=1.5)
    with pytest.raises(ConfigError, match=r"router\.scored_binding\.seq_cap_frac"):
        ScoredBindingOptions(seq_cap_frac=0.0)
    with pytest.raises(ConfigError, match=r"router\.scored_binding\.rounds.*since_release"):
        ScoredBindingOptions(rounds="weekly")
    with pytest.raises(ConfigError, match="growth_frac"):
        make_router("scored_binding", growth=0.5)
    with pytest.raises(ConfigError, match="order='oldest'.*allowed: 'shortest'"):
        ScoredBindingOptions.from_late_binding({**LB, "order": "oldest"})


# ----------------------------------------------------------------------------- the search
ps = pytest.importorskip("llm_lb_gym.agents.policy_search")

TINY = dict(generations=2, population=4, seeds_per_generation=2, validation_seeds=(500, 501),
            params=("growth_frac", "room_margin", "period_s"), start=LB, workers=1, seed=5)


def test_search_config_names_bad_options():
    with pytest.raises(ConfigError, match=r"search\.params\[\].*growth_frac"):
        ps.SearchConfig(params=("growth",))
    with pytest.raises(ConfigError, match=r"search\.population=5 is odd"):
        ps.SearchConfig(population=5)
    with pytest.raises(ConfigError, match=r"search\.objective.*e2e"):
        ps.SearchConfig(objective="fast")
    with pytest.raises(ConfigError, match=r"search\.start has unknown options \['bogus'\]"):
        ps.SearchConfig(start={"bogus": 1})


def test_candidates_stay_inside_the_bounds():
    start = ps.start_options(LB)
    c = ps.candidate(start, ("growth_frac", "room_margin", "period_s"), np.array([100.0, -100.0, -5.0]))
    assert (c.growth_frac, c.room_margin, c.period_s) == (1.0, -0.5, 0.0)
    assert ps.candidate(start, ("growth_frac",), np.zeros(1)) == start


def test_tiny_search_is_deterministic_and_never_worse_than_its_start():
    cfg = ps.SearchConfig(**TINY)
    a = ps.policy_search(ENV, cfg, log=lambda *_: None)
    b = ps.policy_search(ENV, ps.SearchConfig(**{**TINY, "workers": 2}), log=lambda *_: None)
    strip = lambda h: [{k: v for k, v in row.items() if k != "wall_s"} for row in h]  # noqa: E731
    assert strip(a["history"]) == strip(b["history"])
    assert a["best_options"] == b["best_options"]
    assert len(a["history"]) == 2
    # Replayed independently on the validation seeds: the kept point is no worse than the start.
    with ps.Episodes(1) as eps:
        pairs = [(ENV, s) for s in cfg.validation_seeds]
        start = eps.table(ps.ROUTER, a["start_options"].as_dict(), pairs)
        best = eps.table(ps.ROUTER, a["best_options"].as_dict(), pairs)
    assert ps.objective(cfg, best, start, None) == pytest.approx(a["best_val_objective"])
    assert a["best_val_objective"] <= 0.0 == ps.objective(cfg, start, start, None)
    c = ps.policy_search(ENV, ps.SearchConfig(**{**TINY, "seed": 6}), log=lambda *_: None)
    assert strip(c["history"]) != strip(a["history"])   # the seed is what fixes the search


def test_entry_point_runs_tiny_and_saves_options_evaluate_can_use(tmp_path):
    import yaml

    from llm_lb_gym.experiments.policy_search import search, search_config
    from llm_lb_gym.experiments._hydra import compose

    over = ["experiment=[v100_near_capacity,debug]", "search.generations=1", "search.population=2",
            "search.seeds_per_generation=1", "search.validation_seeds=[500]", "search.workers=1",
            "test.episodes=2", "progress=false"]
    with pytest.raises(ConfigError, match=r"unknown search option\(s\): generation; allowed: .*generations"):
        search_config(compose("policy_search", over + ["+search.generation=3"]))
    res = search(compose("policy_search", over), out=tmp_path)
    saved = yaml.safe_load((tmp_path / "scored_binding.yaml").read_text())["scored_binding"]
    assert ScoredBindingOptions(**saved) == ScoredBindingOptions(**res["summary"]["found_options"])
    assert set(res["summary"]["change_vs_each_pct"]) == {"round_robin", "least_requests", "late_binding"}
    assert (tmp_path / "search_summary.json").exists() and (tmp_path / "test" / "results.csv").exists()


def test_search_over_conditions_is_deterministic_and_constrained():
    """conditions=train_synthetic: pairs drawn from the space, the same history whatever the
    worker count; the constrained objective is the E2E log ratio vs round robin plus the
    violation, checked here on the validation episodes by hand."""
    cfg = dict(TINY, conditions="train_synthetic", conditions_per_generation=2, validation_episodes=2,
               objective="constrained", params=("growth_frac", "hedge", "max_hold_s"), generations=1)
    small = {"requests_per_instance": 30}
    import dataclasses

    import llm_lb_gym.suite.suites as suites
    orig = suites.TRAIN_SYNTHETIC
    suites.TRAIN_SYNTHETIC = dataclasses.replace(orig, **small)
    try:
        a = ps.policy_search({}, ps.SearchConfig(**cfg), log=lambda *_: None)
        b = ps.policy_search({}, ps.SearchConfig(**{**cfg, "workers": 2}), log=lambda *_: None)
        strip = lambda h: [{k: v for k, v in row.items() if k != "wall_s"} for row in h]  # noqa: E731
        assert strip(a["history"]) == strip(b["history"])
        sc = ps.SearchConfig(**cfg)
        pairs = ps.validation_pairs(sc, {})
        assert len(pairs) == 2 and all(kw["num_requests"] % 30 == 0 for kw, _ in pairs)
        with ps.Episodes(1) as eps:
            start = eps.table(ps.ROUTER, a["start_options"].as_dict(), pairs)
            rr = eps.table("round_robin", {}, pairs)
        e = np.array([r["mean_e2e_s"] for r in start]) / np.array([r["mean_e2e_s"] for r in rr])
        by_hand = 100 * np.mean(np.log(e)) + np.mean(ps.constraint_violation(start, rr))
        assert ps.objective(sc, start, start, rr) == pytest.approx(by_hand)
        assert a["best_val_objective"] <= by_hand + 1e-9
    finally:
        suites.TRAIN_SYNTHETIC = orig


def test_ray_executor_gives_the_processes_history():
    """executor=ray runs the same episodes as Ray tasks: the search's history is the same bit for
    bit as with worker processes (a cluster shortens the search, never changes it)."""
    pytest.importorskip("ray")
    import ray

    cfg = dict(TINY, generations=1)
    a = ps.policy_search(ENV, ps.SearchConfig(**{**cfg, "workers": 2}), log=lambda *_: None)
    try:
        b = ps.policy_search(ENV, ps.SearchConfig(**{**cfg, "workers": 2, "executor": "ray"}),
                             log=lambda *_: None)
    finally:
        ray.shutdown()
    strip = lambda h: [{k: v for k, v in row.items() if k != "wall_s"} for row in h]  # noqa: E731
    assert strip(a["history"]) == strip(b["history"])
    assert a["best_options"].as_dict() == b["best_options"].as_dict()
