"""The rollout policy-improvement operator and approximate policy iteration (issue 20).

The operator's scores are exact integrals of the simulated future (checked against the real
continuation of an episode), shared futures make identical candidates score identically, it
never reads what a deployed router cannot know, and bad options are named. Policy iteration
starts as its teacher bit for bit, and its saved network loads, decides and refuses bad files.
"""

from __future__ import annotations

import dataclasses
import math
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from llm_lb_gym._validate import ConfigError  # noqa: E402
from llm_lb_gym.envs.cluster_env import LLMClusterEnv  # noqa: E402
from llm_lb_gym.routers import make_router  # noqa: E402
from llm_lb_gym.routers.drive import decide  # noqa: E402
from llm_lb_gym.routers.improve import ImprovementOptions, RolloutImprovement, in_system_integral  # noqa: E402
from llm_lb_gym.rollout import make_env_router  # noqa: E402

LB = {"period_s": 0.1, "rounds": "since_release", "reserve": "full", "order": "shortest"}
ENV = dict(num_instances=2, num_requests=90, arrival_rate_rps=14.0, engine={"num_kv_blocks": 400},
           action={"candidates": 3, "order": "shortest"},
           obs={"features": ("age", "block_need", "free_kv_blocks", "waiting_blocks", "time_since_route")},
           reward={"penalty": "latency"})


def operator(env, **opts) -> RolloutImprovement:
    o = ImprovementOptions(**{"base": "late_binding", "base_options": LB,
                              "decision_interval_s": env.cfg.decision_interval_s, **opts})
    ob = env.obs_builder
    return RolloutImprovement(o, workload=env.workload, predictor=env.predictor,
                              prompt_scheme=ob.prompt_scheme, decode_scheme=ob.decode_scheme,
                              base_router=make_env_router("late_binding", env, **LB))


def busy_state(seed=3, min_queue=3):
    """An env (driven by late_binding) at a decision with several requests at the router."""
    env = LLMClusterEnv(**ENV)
    env.reset(seed=seed)
    teacher = make_env_router("late_binding", env, **LB)
    teacher.reset(np.random.default_rng(0), env.m)
    while True:
        c = env.cluster
        if len(c.queue) >= min_queue and c.n_arrived > 20:
            return env, teacher
        choice = decide(c, teacher) if c.queue else None
        if choice is None:
            _, _, term, _, _ = env.route_step(env.m)
        else:
            _, _, term, _, _ = env.route_step(choice[1], choice[0])
        assert not term, "no busy state found"


# ------------------------------------------------------------------ options
@pytest.mark.parametrize("bad, match", [
    ({"base": "lookahead"}, r"improve.base='lookahead' is not valid; allowed: round_robin"),
    ({"base": "rr"}, r"improve.base='rr'"),
    ({"base_options": {"period": 1}}, r"period.*period_s"),
    ({"base_options": {"period_s": -1.0}}, r"router.late_binding.period_s=-1.0"),
    ({"base_options": [1]}, r"base_options=\[1\] must be a mapping"),
    ({"samples": 0}, r"improve.samples=0 .*\[1, inf\)"),
    ({"samples": 1.5}, r"improve.samples"),
    ({"plan_horizon_s": 0.0}, r"improve.plan_horizon_s=0.0 .*\(0.0, inf\)"),
    ({"plan_horizon_s": -2.0}, r"improve.plan_horizon_s=-2.0"),
    ({"score": "sum"}, r"improve.score='sum' .*allowed: window, drain"),
    ({"see_future": True, "samples": 2}, r"samples=2 needs see_future=False"),
    ({"antithetic": True, "samples": 3}, r"antithetic=True needs .*even number"),
    ({"see_future": "no"}, r"see_future='no' must be a bool"),
])
def test_bad_options_are_named(bad, match):
    with pytest.raises(ConfigError, match=match):
        ImprovementOptions(**{"base_options": {}, **bad})


def test_operator_needs_a_workload_and_poisson_for_antithetic():
    with pytest.raises(ConfigError, match="needs the workload model"):
        RolloutImprovement(ImprovementOptions())
    from llm_lb_gym.workload.arrivals import DeterministicArrivals
    from llm_lb_gym.workload.task_mix import TaskMixWorkload

    with pytest.raises(ConfigError, match="needs a workload with Poisson arrivals.*DeterministicArrivals"):
        RolloutImprovement(ImprovementOptions(antithetic=True, samples=2),
                           workload=TaskMixWorkload(arrivals=DeterministicArrivals(5.0)))


def test_lookahead_takes_its_base_options():
    env = LLMClusterEnv(**ENV)
    r = make_env_router("lookahead", env, base="late_binding", base_options=LB, candidates=3)
    assert r._base_router.options.period_s == 0.1 and r._base_router.options.rounds == "since_release"
    with pytest.raises(ConfigError, match="router.late_binding.order='tallest'"):
        make_router("lookahead", base="late_binding", base_options={"order": "tallest"})


# ------------------------------------------------------------------ scores
def test_clairvoyant_drain_score_of_the_base_is_the_real_future():
    """With the real future, a horizon past the last arrival and the drain, the base's own
    choice scores exactly the remaining time in the system of every request, as the episode
    continued under the base really gives it."""
    env, teacher = busy_state()
    c = env.cluster
    op = operator(env, see_future=True, samples=1, plan_horizon_s=1e4)
    own = decide(c, teacher)
    lo = op.first_unfinished(c)
    t = c.t
    score = op.score(c, [own], np.random.default_rng(0), base_seed=0)[0, 0]
    # continue the real episode with the teacher (same router state: rounds since release)
    while True:
        cl = env.cluster
        choice = decide(cl, teacher) if cl.queue else None
        _, _, term, _, _ = (env.route_step(env.m) if choice is None
                            else env.route_step(choice[1], choice[0]))
        if term:
            break
    real = in_system_integral(env.cluster.table, lo, env.cluster.table.n, t, math.inf)
    assert score == pytest.approx(real, rel=1e-9)


def test_shared_futures_and_no_side_effects():
    env, teacher = busy_state()
    c = env.cluster
    before = pickle.dumps(c)
    op = operator(env, samples=4, plan_horizon_s=1.0)
    own = decide(c, teacher)
    others = [(p, i) for p in range(3) for i in range(2) if (p, i) != own]
    S = op.score(c, [own, others[0], own, None], np.random.default_rng(5))
    assert S.shape == (4, 4)
    np.testing.assert_array_equal(S[:, 0], S[:, 2])     # same action, same futures: same scores
    assert len(set(S[:, 0])) > 1, "the four imagined futures should differ"
    assert pickle.dumps(c) == before
    S2 = operator(env, samples=4, plan_horizon_s=1.0).score(c, [own, others[0], own, None], np.random.default_rng(5))
    np.testing.assert_array_equal(S, S2)                 # determinism
    A = operator(env, samples=4, plan_horizon_s=1.0, antithetic=True).score(c, [own, None], np.random.default_rng(5))
    assert A.shape == (4, 2) and np.all(np.isfinite(A))


def test_deployable_scores_ignore_true_lengths_of_unrouted_requests():
    env, teacher = busy_state()
    c = env.cluster
    hidden = pickle.loads(pickle.dumps(c))
    rng = np.random.default_rng(4)
    for rid in list(hidden.queue) + list(range(hidden._next, hidden.table.n)):
        hidden.table.decode[rid] = int(rng.integers(1, 300))
    cands = [decide(c, teacher), None, (0, 1)]
    a = operator(env, samples=2).score(c, cands, np.random.default_rng(1), base_seed=3)
    b = operator(env, samples=2).score(hidden, cands, np.random.default_rng(1), base_seed=3)
    np.testing.assert_array_equal(a, b)
    clair = [operator(env, see_future=True, samples=1).score(x, cands, np.random.default_rng(1), base_seed=3)
             for x in (c, hidden)]
    assert not np.array_equal(*clair), "the clairvoyant reference should see the true lengths"


# ------------------------------------------------------------------ policy iteration
def _kw():
    return {**ENV, "num_requests": 70}


def _cfg(**kw):
    from llm_lb_gym.agents.policy_iteration import PolicyIterationConfig

    base = dict(teacher_options=LB, rounds=1, episodes_per_round=1, label_every=2,
                max_labels_per_episode=6, plan_horizon_s=0.3, samples=2, validation_seeds=(500,),
                epochs=2, executor="inline", round_seed=7)
    return PolicyIterationConfig(**{**base, **kw})


def test_config_errors_are_named():
    for bad, match in [({"samples": 0}, r"improve.samples=0"), ({"temperature": 0.0}, r"improve.temperature=0.0"),
                       ({"executor": "threads"}, r"improve.executor='threads' .*allowed: process, ray, inline"),
                       ({"validation_seeds": ()}, r"validation_seeds is empty"),
                       ({"rounds": -1}, r"improve.rounds=-1")]:
        with pytest.raises(ConfigError, match=match):
            _cfg(**bad)


def test_improvement_targets():
    from llm_lb_gym.agents.policy_iteration import improvement_targets

    logits = np.array([[0.0, 2.0, 0.0, -1.0]])
    mask = np.array([[True, True, True, False]])
    p0 = improvement_targets(logits, mask, np.full((1, 4), np.nan), 1.0)
    e = np.exp([0.0, 2.0, 0.0])
    np.testing.assert_allclose(p0[0, :3], e / e.sum())
    assert p0[0, 3] == 0.0
    p = improvement_targets(logits, mask, np.array([[5.0, 0.0, np.nan, np.nan]]), 0.1)
    assert p[0, 0] > 0.999


def test_advantages_are_teacher_minus_candidate_by_hand():
    from llm_lb_gym.agents.policy_iteration import advantages

    # Two futures, three candidates, the teacher's is 1; scores are seconds in the system.
    S = np.array([[10.0, 12.0, 15.0],
                  [11.0, 13.0, 12.0]])
    mean, se = advantages(S, 1)
    np.testing.assert_allclose(mean, [2.0, 0.0, -1.0])          # (12-10 + 13-11) / 2, 0, (-3 + 1) / 2
    np.testing.assert_allclose(se, [0.0, 0.0, 2.0])   # d = (-3, 1): sd sqrt(8), / sqrt(2)
    one_mean, one_se = advantages(S[:1], 0)
    np.testing.assert_allclose(one_mean, [0.0, -2.0, -5.0]) and np.all(np.isnan(one_se))


def test_the_label_of_a_hold_on_an_idle_cluster_is_minus_one_interval():
    """Hand-worked on a real state: one request, idle instances, the clairvoyant operator (one
    exact future). The teacher routes it now; holding it one decision interval (0.02 s) then
    routing it as the teacher would ends it exactly one interval later on an identical idle
    instance, so defer's advantage is -0.02 s and every route's is 0 (identical instances)."""
    from llm_lb_gym.agents.policy_iteration import label_advantages

    env = LLMClusterEnv(num_instances=2, num_requests=1, action={"mask_idle_defer": False})
    env.reset(seed=0)
    teacher = make_env_router("late_binding", env, **LB)
    teacher.reset(np.random.default_rng(0), env.m)
    choice = decide(env.cluster, teacher)
    assert choice == (0, 0)
    mask = env.action_masks()
    assert mask.tolist() == [True, True, True]
    op = operator(env, see_future=True, samples=1)
    adv, se = label_advantages(env, op, mask, env.action_for(*choice), np.random.default_rng(0))
    assert adv[0] == 0.0 and adv[1] == 0.0
    assert adv[2] == pytest.approx(-env.cfg.decision_interval_s, rel=1e-9)
    assert np.isnan(se).all()


def test_a_better_route_than_the_teachers_gets_a_positive_label():
    """Two requests arrive together; the first went to instance 0. Taking the second there too
    as the reference choice, the idle instance 1 finishes it sooner: a positive advantage."""
    from llm_lb_gym.agents.policy_iteration import label_advantages

    env = LLMClusterEnv(num_instances=2, num_requests=2, arrival_rate_rps=1000.0)
    env.reset(seed=1)
    while len(env.cluster.queue) < 2:
        env.route_step(env.m)
    env.route_step(0, 0)                                    # the first to instance 0
    assert len(env.cluster.queue) == 1 and env.cluster.engines[1].idle()
    mask = env.action_masks()
    op = operator(env, see_future=True, samples=1)
    adv, _ = label_advantages(env, op, mask, env.action_for(0, 0), np.random.default_rng(0))
    assert adv[0] == 0.0 and adv[1] > 0.0                   # the idle instance beats the busy one


def test_the_advantage_loss_moves_the_network_towards_the_labels():
    """``loss=advantage`` regresses net(a) - net(teacher's action) on the labels. Two states, the
    teacher routing to instance 0 in both: deferring is labelled +1 in one and -1 in the other,
    so the network (starting at zero: its output layers are zeroed) must end up preferring defer
    by about 1 in the first and disliking it by about 1 in the second."""
    from llm_lb_gym.agents.policy_iteration import fit, make_net

    env = LLMClusterEnv(**_kw())
    obs_a, _ = env.reset(seed=2)
    obs_b, _ = env.reset(seed=5)
    assert not np.array_equal(obs_a, obs_b)
    n, k, d = 32, env.defer_action + 1, env.defer_action
    mask = np.zeros((n, k), bool)
    mask[:, [0, d]] = True
    adv = np.full((n, k), np.nan)
    adv[:, 0] = 0.0
    adv[: n // 2, d], adv[n // 2:, d] = 1.0, -1.0
    obs = np.concatenate([np.repeat(np.asarray(o, np.float32)[None], n // 2, 0) for o in (obs_a, obs_b)])
    data = {"obs": obs, "mask": mask, "teacher": np.zeros(n, np.int64), "target": np.zeros((n, k), np.float32),
            "adv": adv, "weight": np.ones(n, np.float32)}
    cfg = _cfg(loss="advantage", epochs=80, learning_rate=1e-2, batch_size=8)
    net = make_net(env.obs_layout.as_dict(), cfg, 0)
    fit(net, data, cfg, seed=0)
    with torch.inference_mode():
        q = net(torch.from_numpy(obs[[0, -1]])).numpy()
    assert q[0, d] - q[0, 0] == pytest.approx(1.0, abs=0.25)
    assert q[1, d] - q[1, 0] == pytest.approx(-1.0, abs=0.25)


def test_round_zero_is_the_teacher_and_the_result_loads(tmp_path):
    from llm_lb_gym.agents.policy_iteration import DistilledAgent, NetPolicy, policy_iteration
    from llm_lb_gym.rollout import rollout_agent, rollout_router

    res = policy_iteration(_kw(), _cfg(), out=tmp_path, log=lambda s: None)
    h = res["history"]
    assert h[0]["val_vs_teacher_pct"] == 0.0          # prior + zero output layers = the teacher
    assert h[1]["labelled"] > 0 and math.isfinite(h[1]["loss"])
    for name in ("round0.pt", "round1.pt", "best_policy.pt"):
        assert (tmp_path / name).exists()
    env = LLMClusterEnv(**{**_kw(), "action": {**ENV["action"], **DistilledAgent.ENV_OPTIONS["action"]}})
    agent = DistilledAgent.load(tmp_path / "round0.pt", env)
    a = rollout_agent(env, agent, 1000)
    b = rollout_router(env, make_env_router("late_binding", env, **LB), 1000)
    assert a.metrics["mean_e2e_s"] == b.metrics["mean_e2e_s"] and a.metrics["unfinished"] == 0
    assert max(agent.decision_wall_s) < 1.0
    with pytest.raises(ConfigError, match="does not exist"):
        NetPolicy.load(tmp_path / "nope.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a network")
    with pytest.raises(ConfigError, match="bad.pt is not a saved policy-iteration network"):
        NetPolicy.load(tmp_path / "bad.pt")


def test_a_teacher_the_actions_cannot_express_is_refused():
    from llm_lb_gym.agents.policy_iteration import policy_iteration

    kw = {**_kw(), "action": {"candidates": 1, "order": "oldest"}}
    with pytest.raises(ConfigError, match="cannot express"):
        policy_iteration(kw, _cfg(rounds=0), log=lambda s: None)


def test_workers_give_the_same_result_as_inline():
    from llm_lb_gym.agents.policy_iteration import policy_iteration

    a = policy_iteration(_kw(), _cfg(), log=lambda s: None)["history"]
    b = policy_iteration(_kw(), _cfg(executor="process", workers=2), log=lambda s: None)["history"]
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if "wall" not in k and "ms" not in k} == \
               {k: v for k, v in y.items() if "wall" not in k and "ms" not in k}


def test_improve_entry_point_debug_size(tmp_path):
    from llm_lb_gym.experiments.improve import improve
    from llm_lb_gym.experiments.reproduce import compose

    cfg = compose("improve", ["experiment=[v100_near_capacity,learned_router,debug]", "improve.rounds=1",
                              "improve.episodes_per_round=1", "improve.max_labels_per_episode=4",
                              "improve.label_every=2", "improve.validation_seeds=[500]", "improve.epochs=1",
                              "improve.executor=inline", "test.episodes=2", "test.policies=[round_robin,late_binding]",
                              "progress=false"])
    res = improve(cfg, out=tmp_path)
    s = res["summary"]
    assert (tmp_path / "best_policy.pt").exists() and (tmp_path / "test" / "summary.md").exists()
    assert len(s["history"]) == 2 and s["decision_ms"]["n"] > 0
    assert all(math.isfinite(x) for x in s["change_vs_teacher_pct"][:1])
    assert "distilled" in s["table"] and list((tmp_path / "tb").rglob("events.out.tfevents*"))
    with pytest.raises(ConfigError, match="improve.*horizon"):
        improve(compose("improve", ["experiment=[v100_near_capacity,learned_router,debug]",
                                    "improve.plan_horizon_s=0"]), out=tmp_path / "bad")
    with pytest.raises(ConfigError, match="unknown improve option.*horizon; allowed: .*plan_horizon_s"):
        improve(compose("improve", ["experiment=[v100_near_capacity,learned_router,debug]",
                                    "+improve.horizon=1"]), out=tmp_path / "bad2")


def test_main_job_default_distils_the_settings_scored_binding(tmp_path):
    """``llm-lb-gym improve`` as the README runs it: the teacher is the setting's searched
    scored_binding, the env's candidates follow its order with its weights; a debug-size run
    of that config (one round) works end to end and its round 0 is the teacher exactly."""
    from llm_lb_gym.experiments._hydra import to_container
    from llm_lb_gym.experiments.improve import improve
    from llm_lb_gym.experiments.reproduce import compose

    cfg = compose("improve", [])
    sb = to_container(cfg.eval.policy_options.scored_binding)
    assert cfg.improve.teacher == "scored_binding" and to_container(cfg.improve.teacher_options) == sb
    assert cfg.env.action.order == "scored" and cfg.env.action.max_wait_s == sb["max_wait_s"]
    assert {k: v for k, v in to_container(cfg.env.action.order_weights).items()} == \
           {k: sb[k] for k in ("age_per_s", "prompt_weight", "late_penalty")}
    assert "scored_binding" in cfg.test.policies
    small = compose("improve", ["experiment=[v100_near_capacity,learned_router,scored_teacher,debug]",
                                "improve.rounds=1", "improve.episodes_per_round=1",
                                "improve.max_labels_per_episode=3", "improve.label_every=3",
                                "improve.validation_seeds=[500]", "improve.epochs=1", "improve.executor=inline",
                                "test.episodes=1", "test.policies=[round_robin,scored_binding]", "progress=false"])
    s = improve(small, out=tmp_path)["summary"]
    assert s["history"][0]["val_vs_teacher_pct"] == 0.0


def test_numpy_actor_matches_the_network():
    """The batch-1 numpy path chooses what the torch network chooses (same preferences up to the
    value and centring, which are constant over the actions)."""
    from llm_lb_gym.agents.policy_iteration import NetPolicy, make_net

    env = LLMClusterEnv(**_kw())
    layout = env.obs_layout.as_dict()
    net = make_net(layout, _cfg(), 3)
    for mod in (net.pair_out, net.defer):      # non-zero heads, so the choice is the network's
        for prm in mod.parameters():
            torch.nn.init.normal_(prm, std=0.3)
    pol = NetPolicy(net, prior=0.5)
    assert pol.fast is not None
    obs, info = env.reset(seed=2)
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(60):
        with torch.inference_mode():
            q = net(torch.from_numpy(np.asarray(obs, np.float32)[None]))[0].numpy()
        f = pol.fast.preferences(obs)
        np.testing.assert_allclose(f - f.mean(), q - q.mean(), rtol=0, atol=2e-5)
        mask = info["action_mask"]
        t = int(rng.choice(np.flatnonzero(mask)))
        ref = np.where(mask, q + 0.5 * (np.arange(len(q)) == t), -np.inf)
        assert pol.act(obs, mask, t) == int(np.argmax(ref))
        checked += 1
        obs, _, term, trunc, info = env.step(int(rng.choice(np.flatnonzero(mask))))
        if term or trunc:
            break
    assert checked > 20


def test_episodes_over_the_training_distribution():
    """improve.conditions: each episode a condition drawn from the space (seeded), the setting's
    observation/action/reward options on top, one instance count; a mixed cluster without the
    mixed-cluster features and an instance count the space lacks are named."""
    from llm_lb_gym.agents.policy_iteration import condition_pairs

    kw = {"obs": {"features": ["age", "speed", "kv_size"]}, "action": {"candidates": 4},
          "reward": {"penalty": "latency"}, "num_instances": 2}
    cfg = _cfg(conditions="train_synthetic", condition_instances=4)
    pairs = condition_pairs(kw, cfg, [500, 501, 502], 10_000)
    assert [s for _, s in pairs] == [500, 501, 502]
    assert all(p["obs"] == kw["obs"] and p["action"] == kw["action"] and p["reward"] == kw["reward"]
               for p, _ in pairs)
    sizes = {len(p["instances"]) if "instances" in p else p["num_instances"] for p, _ in pairs}
    assert sizes == {4}
    assert condition_pairs(kw, cfg, [500, 501, 502], 10_000) == pairs          # seeded
    assert condition_pairs(kw, cfg, [500, 501, 502], 1) != pairs               # another draw
    assert condition_pairs(kw, _cfg(), [7], 0) == [(kw, 7)]                    # the setting
    with pytest.raises(ConfigError, match="draws mixed clusters: env.obs.features needs speed, kv_size"):
        condition_pairs({"obs": {"features": ["age"]}}, cfg, [500], 0)
    with pytest.raises(ConfigError, match="improve.condition_instances=3: no cluster"):
        condition_pairs(kw, _cfg(conditions="train_synthetic", condition_instances=3), [500], 0)
    with pytest.raises(ConfigError, match="improve.conditions='nope'"):
        _cfg(conditions="nope")
