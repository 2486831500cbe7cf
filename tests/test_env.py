"""LLMCluster-v0: API conformance, determinism, pickling, reward terms, request accounting."""

from __future__ import annotations

import copy
import math
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import llm_lb_gym  # noqa: F401  (registers the env)
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs import LLMClusterEnv
from llm_lb_gym.routers.mixing import MixingParams, mixing_scores
from llm_lb_gym.envs.reward import guidance_term, guidance_weight, ideal_latency_s
from llm_lb_gym.envs.config import RewardConfig
from llm_lb_gym.sim.config import EngineConfig

SMALL = dict(num_requests=120, arrival_rate_rps=20.0)

# Warnings Gymnasium's checker may raise that are expected here, with the reason:
ALLOWED_WARNINGS = (
    # Our Box bounds are wide finite numbers (counts up to num_requests / max_num_seqs).
    "not within the observation space",
)


def _run(env, seed, actions=None, n=None):
    obs, info = env.reset(seed=seed)
    out = [(obs, 0.0, False, info)]
    rng = np.random.default_rng(seed)
    steps = 0
    while True:
        a = actions[steps % len(actions)] if actions else int(rng.integers(env.action_space.n))
        obs, r, term, trunc, info = env.step(a)
        out.append((obs, r, term, info))
        steps += 1
        if term or trunc or (n is not None and steps >= n):
            return out


def test_gymnasium_check_env_passes_without_unexpected_warnings():
    env = gym.make("LLMCluster-v0", **SMALL)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gym_check_env(env.unwrapped, skip_render_check=True)
    unexpected = [str(w.message) for w in caught
                  if not any(a in str(w.message) for a in ALLOWED_WARNINGS)]
    assert not unexpected, unexpected


def test_sb3_check_env_passes():
    from stable_baselines3.common.env_checker import check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(LLMClusterEnv(**SMALL), warn=True)
    assert not [str(w.message) for w in caught], [str(w.message) for w in caught]


def test_dict_observation_passes_check_env():
    env = LLMClusterEnv(obs={"as_dict": True}, **SMALL)
    gym_check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    assert obs["prompt_counts"].shape == (4, 3) and obs["capacity"].shape == (4,)


def test_same_seed_same_trajectory_bit_for_bit():
    a = _run(gym.make("LLMCluster-v0", **SMALL), seed=7, n=400)
    b = _run(gym.make("LLMCluster-v0", **SMALL), seed=7, n=400)
    assert len(a) == len(b)
    for (oa, ra, ta, ia), (ob, rb, tb, ib) in zip(a, b):
        assert np.array_equal(oa, ob) and ra == rb and ta == tb
        assert ia["reward_components"] == ib["reward_components"]
    c = _run(gym.make("LLMCluster-v0", **SMALL), seed=8, n=400)
    assert any(not np.array_equal(x[0], y[0]) for x, y in zip(a, c))


def test_pickle_and_deepcopy_continue_identically():
    env = LLMClusterEnv(**SMALL)
    env.reset(seed=3)
    for a in [0, 1, 4, 2, 3] * 10:
        env.step(a)
    clones = [pickle.loads(pickle.dumps(env)), copy.deepcopy(env)]
    for a in [1, 2, 3, 0, 4] * 20:
        o1, r1, t1, _, _ = env.step(a)
        for clone in clones:
            o2, r2, t2, _, _ = clone.step(a)
            assert np.array_equal(o1, o2) and r1 == r2 and t1 == t2
        if t1:
            break


def test_every_request_accounted_for_at_episode_end():
    for actions in ([0, 1, 2, 3], None):
        env = gym.make("LLMCluster-v0", **SMALL)
        *_, (obs, r, term, info) = _run(env, seed=11, actions=actions)
        assert term
        m = info["metrics"]
        assert m["completed"] + m["rejected"] == m["num_requests"] == 120
        assert m["unfinished"] == 0
        for key in ("num_requests", "completed", "rejected", "mean_e2e_s", "p50_e2e_s", "p90_e2e_s",
                    "p99_e2e_s", "mean_ttft_s", "p99_ttft_s", "mean_tbt_s", "p99_tbt_s",
                    "mean_router_wait_s", "mean_queue_wait_s", "preemptions", "makespan_s",
                    "throughput_rps"):
            assert key in m and not (isinstance(m[key], float) and math.isnan(m[key])), key


def test_action_mask_and_invalid_actions():
    env = LLMClusterEnv(**SMALL)
    obs, info = env.reset(seed=0)
    # A request waits on an idle cluster after reset: every route is valid, deferring is not
    # (it could only delay; an agent that defers forever would never finish the episode).
    assert info["action_mask"].tolist() == [True] * 4 + [False]
    assert env.action_masks().tolist() == info["action_mask"].tolist()
    env_free = LLMClusterEnv(action={"mask_idle_defer": False}, **SMALL)
    assert env_free.reset(seed=0)[1]["action_mask"].tolist() == [True] * 5
    with pytest.raises(ValueError, match="out of range"):
        env.step(5)
    with pytest.raises(ConfigError, match=r"unexpected keyword argument 'num_instance'; allowed: .*num_instances"):
        LLMClusterEnv(num_instance=3)
    with pytest.raises(ConfigError, match="engine.scheduler"):
        LLMClusterEnv(engine={"scheduler": "lifo"})
    with pytest.raises(ConfigError, match="reward.mode"):
        LLMClusterEnv(reward={"mode": "guided"})


def test_defer_advances_one_interval_and_routing_keeps_the_clock():
    # The first defer is masked (a request waits on an idle cluster): carried out as taken here;
    # the default hands it to the fallback router (tests/test_masked_actions.py).
    env = LLMClusterEnv(action={"masked": "as_taken"}, **SMALL)
    env.reset(seed=0)
    t0 = env.cluster.t
    _, _, _, _, info = env.step(env.m)   # defer
    assert info["time_s"] == pytest.approx(t0 + 0.02)
    # Route with two requests waiting: the next decision comes at the same time.
    env2 = LLMClusterEnv(arrival_rate_rps=500.0, num_requests=50, action={"masked": "as_taken"})
    env2.reset(seed=0)
    for _ in range(3):
        env2.step(env2.m)
    assert len(env2.cluster.queue) >= 2
    t = env2.cluster.t
    _, _, _, _, info = env2.step(0)
    assert info["time_s"] == t and info["reward_components"]["penalty"] == 0.0


def test_paper_mode_every_action_advances_one_interval():
    env = LLMClusterEnv(one_action_per_interval=True, arrival_rate_rps=500.0, num_requests=50)
    env.reset(seed=0)
    for _ in range(3):
        t = env.cluster.t
        _, _, term, _, info = env.step(0)
        assert info["time_s"] >= t + 0.02 - 1e-12


def test_guidance_term_by_hand():
    env = LLMClusterEnv(reward={"mode": "workload_aware", "guidance_scale": 2.0}, arrival_rate_rps=500.0,
                        num_requests=60)
    env.reset(seed=0)
    for _ in range(5):
        env.step(env.m)   # let requests pile up in the router queue
    c = env.cluster
    # Load instance 0 and 1 unevenly.
    for a in (0, 0, 1):
        env.step(a)
    head = c.queue[0]
    loads = [e.committed_tokens for e in c.engines]
    scores = mixing_scores(loads, c.table.prompt[head], c.table.pred[head], MixingParams())
    best = int(np.argmax(scores))
    worst = int(np.argmin(scores))
    assert best != worst
    probe = copy.deepcopy(env)
    _, _, _, _, info_best = probe.step(best)
    assert info_best["reward_components"]["guidance"] == 0.0
    _, _, _, _, info_worst = env.step(worst)
    assert info_worst["reward_components"]["guidance"] == pytest.approx(2.0 * (scores[worst] - scores[best]))
    assert info_worst["reward_components"]["guidance"] < 0


def test_guidance_weight_decays_with_training_episodes():
    cfg = RewardConfig(mode="workload_guided", guidance_scale=3.0, decay=0.5)
    assert guidance_weight(cfg, 0) == 3.0
    assert guidance_weight(cfg, 4) == pytest.approx(3.0 * math.exp(-2.0))
    assert guidance_weight(RewardConfig(mode="baseline"), 0) == 0.0
    env = LLMClusterEnv(**SMALL)
    _, info0 = env.reset(seed=0)
    _, info_again = env.reset(seed=0)   # no episode finished in between: same weight
    assert info_again["guidance_weight"] == info0["guidance_weight"]
    _run(env, seed=0, actions=[0, 1, 2, 3])   # one whole episode
    _, info1 = env.reset(seed=0)
    assert info1["guidance_weight"] == pytest.approx(info0["guidance_weight"] * math.exp(-0.5))
    env.set_guidance_episode(10)
    _, info = env.reset(seed=0, options={"guidance_episode": 10})
    assert info["guidance_weight"] == pytest.approx(math.exp(-5.0))


def test_reward_components_sum_and_penalty_by_hand():
    env = LLMClusterEnv(**SMALL)
    env.reset(seed=5)
    c = env.cluster
    # The in-system penalty equals the per-request formula recomputed from scratch.
    for a in [0, 1, 2, 3, 4, 4] * 5:
        _, r, _, _, info = env.step(a)
        comp = info["reward_components"]
        assert r == pytest.approx(comp["penalty"] + comp["completion"] + comp["guidance"])
        tb = c.table
        want = 0.0
        for rid in range(tb.n):
            if tb.status[rid] in (1, 2, 3, 4):   # queued, waiting, prefilling, running
                e = c.engines[tb.instance[rid]] if tb.instance[rid] >= 0 else None
                o = tb.o_base[rid]
                if tb.status[rid] == 4:
                    o = tb.o_base[rid] + e.G - tb.g_base[rid]
                want += tb.inv_ideal[rid] * (1 - min(o / tb.pred[rid], 1.0))
        assert c.penalty() == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_ideal_latency_matches_the_latency_model():
    lat = EngineConfig().latency_model
    got = ideal_latency_s(lat, np.array([10, 1000]), np.array([5.0, 1000.0]))
    assert got[0] == pytest.approx(lat.isolated_request_s(10, 5))
    assert got[1] == pytest.approx(lat.isolated_request_s(1000, 1000))


def test_ideal_latency_behind_a_frontend_counts_its_delay_and_input_work():
    """T_j (and the reward's weight 1/T_j) as the client sees a lone request: behind an API
    server's frontend, its delay and input work on top of the engine's ideal latency; the same
    engine without one gives the engine's alone, bit for bit as before the frontend counted."""
    fe = {"delay_s": 0.03, "request_s": 0.01, "prompt_token_s": 1e-5}
    plain, behind = LLMClusterEnv(**SMALL), LLMClusterEnv(**SMALL, engine={"frontend": fe})
    plain.reset(seed=3)
    behind.reset(seed=3)
    a, b = plain.cluster.table, behind.cluster.table
    p, d = np.array(a.prompt), np.array(a.pred)
    lat = EngineConfig().latency_model
    assert np.array_equal(np.array(a.inv_ideal), 1.0 / ideal_latency_s(lat, p, d))
    want = ideal_latency_s(lat, p, d) + 0.03 + (0.01 + 1e-5 * p)
    assert np.array(b.prompt).tolist() == p.tolist()
    assert 1.0 / np.array(b.inv_ideal) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("options", [SMALL, dict(num_requests=150, arrival_rate_rps=60.0),
                                     dict(num_requests=100, engine={"chunked_prefill": True})])
def test_batched_fast_forward_equals_tick_by_tick(options):
    """The env sums penalties over skipped intervals per instance; the plain loop ticks once per
    interval. Same trajectory; rewards equal up to float summation order."""
    a, b = LLMClusterEnv(**options), LLMClusterEnv(**options)
    b._batched_grid = False
    oa, _ = a.reset(seed=4)
    ob, _ = b.reset(seed=4)
    rng = np.random.default_rng(0)
    assert np.array_equal(oa, ob)
    for _ in range(100_000):
        act = int(rng.integers(5))
        oa, ra, ta, _, ia = a.step(act)
        ob, rb, tb, _, ib = b.step(act)
        assert np.array_equal(oa, ob) and ta == tb and ia["time_s"] == ib["time_s"]
        assert ra == pytest.approx(rb, rel=1e-9, abs=1e-9)
        if ta:
            break
    assert ta and ia["metrics"]["mean_e2e_s"] == ib["metrics"]["mean_e2e_s"]


@settings(max_examples=300, deadline=None)
@given(loads=st.lists(st.floats(0.0, 5e5, allow_nan=False), min_size=1, max_size=8),
       prompt=st.integers(1, 4000), pred=st.floats(1.0, 4096.0), data=st.data())
def test_guidance_term_equals_max_over_all_scores(loads, prompt, pred, data):
    """guidance_term evaluates only the chosen and the least-loaded instance; it must equal the
    definition over every instance's score, exactly."""
    cfg = RewardConfig(mixing={"eps_s": data.draw(st.sampled_from([0.05, 0.5, 5.0]))})
    chosen = data.draw(st.integers(0, len(loads) - 1))
    scores = mixing_scores(loads, prompt, pred, cfg.mixing)
    assert guidance_term(loads, prompt, pred, chosen, cfg) == scores[chosen] - max(scores)


def test_capacity_feature_by_hand():
    """capacity_i = 1 - committed_i / kv_tokens_i (committed: prompt + predicted decode tokens of
    the requests on instance i): 100 blocks of 16 tokens; the first request goes to instance 0,
    and at the next decision (the second arrival, 1 ms later: it is still prefilling) instance 0
    has 1 - (p + pred) / 1600 and the idle instance 1 has 1."""
    env = LLMClusterEnv(num_instances=2, num_requests=2, arrival_rate_rps=1000.0,
                        engine={"num_kv_blocks": 100}, obs={"as_dict": True})
    env.reset(seed=0)
    assert env.obs_builder.kv_tokens_list == [1600.0, 1600.0]
    while not env.cluster.queue:
        env.route_step(env.m)
    rid = env.cluster.queue[0]
    obs, *_ = env.route_step(0)
    tb = env.cluster.table
    from llm_lb_gym.sim.request import Status

    assert tb.status[rid] != Status.FINISHED and env.cluster.queue   # not finished; the second waits
    assert obs["capacity"][0] == pytest.approx(1.0 - (tb.prompt[rid] + tb.pred[rid]) / 1600.0, rel=1e-6)
    assert obs["capacity"][1] == 1.0
