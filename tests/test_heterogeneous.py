"""Mixed clusters: instances with their own engine configs (``instances=[...]``).

Config validation, the homogeneous path unchanged, speed definitions (``sim/speed.py``), routers
that prefer a faster instance, observation columns, whole episodes, and the Hydra experiment.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env

import llm_lb_gym  # noqa: F401  (registers the env)
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs.observation import MIXED_CLUSTER_FEATURES
from llm_lb_gym.routers import ROUTERS, make_router, run_router
from llm_lb_gym.routers.drive import build_table, decide
from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.latency import get_preset, ideal_latency_s
from llm_lb_gym.sim.request import Status
from llm_lb_gym.sim.speed import REFERENCE_DECODE_TOKENS, REFERENCE_PROMPT_TOKENS, InstanceSpeeds
from llm_lb_gym.workload.batch import RequestBatch

from test_routers import stress_episode

A100, V100 = "llama2-7b-a100", "llama2-7b-v100"
MIXED = [{"preset": A100, "count": 2}, {"preset": V100, "count": 2}]
SMALL = dict(num_requests=60, arrival_rate_rps=40.0)


# ----------------------------------------------------------------------------- config
def test_instance_groups_expand_in_order_over_the_base_engine():
    c = ClusterConfig(engine=EngineConfig(max_num_seqs=64),
                      instances=[{"preset": A100, "count": 2}, {"preset": V100, "scheduler": "bin_packing"}])
    assert c.num_instances == 3 and not c.homogeneous
    assert [e.preset for e in c.engines] == [A100, A100, V100]
    assert [e.max_num_seqs for e in c.engines] == [64, 64, 64]          # from the base engine
    assert [e.scheduler for e in c.engines] == ["fcfs", "fcfs", "bin_packing"]
    assert c.describe() == f"2 x {A100} + 1 x {V100}"
    assert ClusterConfig(num_instances=3, instances=[EngineConfig(), EngineConfig(), EngineConfig()]).homogeneous
    assert ClusterConfig().num_instances == 4 and ClusterConfig().instances is None
    assert ClusterConfig().describe() == f"4 x {V100}"


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_instances=3, instances=MIXED),
     r"num_instances=3 and instances \(4 instances in 2 groups\) disagree.*num_instances=null"),
    (dict(instances=[{"preset": A100}, {"count": 0}]), r"instances\[1\]\.count=0 is out of range"),
    (dict(instances=[{"preset": A100}, {"count": 1.5}]), r"instances\[1\]\.count=1.5 must be an integer"),
    (dict(instances=[{"preset": "a100"}]), r"instances\[0\]: unknown hardware preset 'a100'; allowed: .*llama2-7b-a100"),
    (dict(instances=[{"preset": A100}, {"max_num_seqs": 0}]), r"instances\[1\]: engine\.max_num_seqs=0 is out of range"),
    (dict(instances=[{"presets": A100}]), r"unknown instances\[0\] option\(s\): presets; allowed: .*count.*preset"),
    (dict(instances=[]), r"instances is empty"),
    (dict(instances={"preset": A100}), r"instances=.* must be a list of engine groups"),
    (dict(instances=[A100]), r"instances\[0\]='llama2-7b-a100' must be an engine group"),
    (dict(instances=[{"count": 1025}]), r"instances\[0\]\.count=1025 is out of range; allowed: \[1, 1024\]"),
])
def test_bad_instance_groups_name_the_group_and_field(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        gym.make("LLMCluster-v0", **kwargs)
    with pytest.raises(ConfigError, match=r"cluster\.(num_)?instances"):   # the sim's own prefix
        ClusterConfig(**kwargs)


# ------------------------------------------------------------------- homogeneous path
def _stream(env, seed, steps=400):
    obs, info = env.reset(seed=seed)
    out = [obs]
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        obs, r, term, trunc, info = env.step(int(rng.choice(np.flatnonzero(info["action_mask"]))))
        out += [obs, np.float64(r)]
        if term or trunc:
            break
    return out


def test_equal_groups_are_the_homogeneous_cluster_bit_for_bit():
    """A list of identical groups takes the homogeneous path: same observations and rewards as
    ``num_instances`` (and the observation has no extra columns)."""
    kw = dict(SMALL, obs={"features": ("free_kv_blocks", "waiting_blocks")})
    a = gym.make("LLMCluster-v0", num_instances=4, **kw)
    b = gym.make("LLMCluster-v0", instances=[{"count": 3}, {"preset": V100}], **kw)
    assert b.unwrapped.speeds.homogeneous and a.observation_space == b.observation_space
    for x, y in zip(_stream(a, 3), _stream(b, 3), strict=True):
        assert np.array_equal(x, y)


def test_homogeneous_speeds_are_exactly_one_and_t_j_is_the_instance_model():
    sp = InstanceSpeeds(ClusterConfig(num_instances=3).engines)
    assert sp.homogeneous and sp.relative_speed == [1.0, 1.0, 1.0]
    p, d = np.array([10, 500, 3000]), np.array([1.0, 77.5, 900.0])
    lat = get_preset(V100).latency
    assert np.array_equal(sp.ideal_latency_s(p, d), ideal_latency_s(lat, p, d))


def test_homogeneous_default_observation_unchanged():
    env = gym.make("LLMCluster-v0")
    assert env.observation_space.shape == (36,) and env.unwrapped.obs_cfg.features == ()


# ----------------------------------------------------------------------------- speed
def test_speed_definitions_on_a100_plus_v100():
    sp = InstanceSpeeds(ClusterConfig(instances=[{"preset": V100}, {"preset": A100}]).engines)
    a, v = get_preset(A100).latency, get_preset(V100).latency
    ref = REFERENCE_PROMPT_TOKENS, REFERENCE_DECODE_TOKENS
    assert sp.reference_s == [v.isolated_request_s(*ref), a.isolated_request_s(*ref)]
    assert sp.relative_speed[1] == 1.0 and 0.0 < sp.relative_speed[0] < 1.0
    assert sp.relative_speed[0] == pytest.approx(a.isolated_request_s(*ref) / v.isolated_request_s(*ref))
    assert sp.token_s[0] > sp.token_s[1]
    assert sp.service_s(0, 300, 120.0) == v.isolated_request_s(300, 120)
    assert sp.kv_tokens == [EngineConfig(preset=V100).total_blocks * 16, EngineConfig(preset=A100).total_blocks * 16]
    # T_j: the least ideal latency over the instance types (the A100's on these presets).
    p, d = np.array([1, 200, 3000]), np.array([1.0, 300.0, 1000.0])
    assert np.array_equal(sp.ideal_latency_s(p, d), np.minimum(ideal_latency_s(a, p, d), ideal_latency_s(v, p, d)))
    assert np.array_equal(sp.ideal_latency_s(p, d), ideal_latency_s(a, p, d))


def test_env_reward_weights_use_the_fastest_instance_ideal_latency():
    env = gym.make("LLMCluster-v0", instances=MIXED, **SMALL)
    env.reset(seed=2)
    base = env.unwrapped
    tb = base.cluster.table
    expected = 1.0 / ideal_latency_s(get_preset(A100).latency, np.array(tb.prompt), np.array(tb.pred))
    assert np.array_equal(np.array(tb.inv_ideal), expected)


# ----------------------------------------------------------------------------- routers
LOAD_ROUTERS = ("jsq", "min_min", "decode_balancer", "least_requests", "power_of_two")


@pytest.mark.parametrize("name", LOAD_ROUTERS)
def test_load_routers_prefer_the_faster_idle_instance(name):
    """Slow V100 first, so ties to the lowest index cannot explain the choice of the A100."""
    c = Cluster(ClusterConfig(instances=[{"preset": V100}, {"preset": A100}]),
                build_table(RequestBatch.from_arrays([0.0], [400], [300])))
    c.advance_to(0.0)
    r = make_router(name)
    r.reset(np.random.default_rng(0), 2)
    assert decide(c, r) == (0, 1)
    # The same cluster of two V100s: the tie goes to instance 0, as before.
    h = Cluster(ClusterConfig(num_instances=2), build_table(RequestBatch.from_arrays([0.0], [400], [300])))
    h.advance_to(0.0)
    r.reset(np.random.default_rng(0), 2)
    assert decide(h, r) == (0, 0)


def test_jsq_weighs_backlog_by_instance_speed():
    """Equal token backlogs: the faster instance finishes the new request first. A slow instance
    wins only once the fast one holds enough more work."""
    rows = [(0.0, 100, 200)] * 3
    b = RequestBatch.from_arrays(*zip(*rows))
    c = Cluster(ClusterConfig(instances=[{"preset": V100}, {"preset": A100}]), build_table(b))
    c.advance_to(0.0)
    c.route(0)
    c.route(1)
    r = make_router("jsq")
    r.reset(np.random.default_rng(0), 2)
    assert decide(c, r) == (0, 1)
    # Pile work on the A100 until its backlog in seconds exceeds the V100's.
    rows = [(0.0, 100, 200)] + [(0.0, 1000, 2000)] * 4 + [(0.0, 100, 200)]
    c = Cluster(ClusterConfig(instances=[{"preset": V100}, {"preset": A100}]),
                build_table(RequestBatch.from_arrays(*zip(*rows))))
    c.advance_to(0.0)
    for i in (0, 1, 1, 1, 1):
        c.route(i)
    r.reset(np.random.default_rng(0), 2)
    assert decide(c, r) == (0, 0)


@pytest.mark.parametrize("name", ROUTERS)
def test_every_router_finishes_a_mixed_episode(name):
    """Tight, unequal KV caches and block sizes: preemptions, rejections of requests that do not
    fit the smallest instance, invariants checked at every state change."""
    b, pred, scheme, opts = stress_episode(name, 5)
    ccfg = ClusterConfig(instances=[{"preset": A100, "num_kv_blocks": 200, "count": 2},
                                    {"preset": V100, "num_kv_blocks": 64, "block_size": 8}])
    dt = 0.05 if make_router(name).defers else 0.0
    c = run_router(b, ccfg, make_router(name, **opts), np.random.default_rng(1), dt, pred,
                   decode_scheme=scheme, check=True)
    status = np.array(c.table.status)
    assert set(status) <= {Status.FINISHED, Status.REJECTED}
    assert c.n_finished + c.n_rejected == len(b) and c.n_rejected > 0
    # Rejected exactly when a request does not fit the smallest instance's KV (64 blocks of 8,
    # 1% watermark: 63 blocks = 504 tokens) or context.
    too_big = (b.prompt_tokens + b.decode_tokens) > 63 * 8
    assert np.array_equal(status == Status.REJECTED, too_big)
    assert set(c.table.reject_reason[i] for i in np.flatnonzero(too_big)) == {"exceeds_kv_capacity"}


# ----------------------------------------------------------------------------- env
def test_mixed_observation_has_speed_and_kv_size_columns():
    env = gym.make("LLMCluster-v0", instances=[{"preset": V100}, {"preset": A100, "max_num_seqs": 64}],
                   obs={"features": ("free_kv_blocks",)}, **SMALL)
    base = env.unwrapped
    assert base.obs_cfg.features == ("free_kv_blocks", *MIXED_CLUSTER_FEATURES)
    lay = base.obs_layout
    assert lay.instance_dim == 3 + 3 + 2 + 3
    obs, _ = env.reset(seed=0)
    inst = obs[lay.global_dim + lay.num_candidates * lay.candidate_dim:].reshape(2, lay.instance_dim)
    sp = base.speeds
    np.testing.assert_array_equal(inst[:, -2], np.float32(sp.relative_speed))
    # float32 KV tokens times the float32 scale 1 / largest, as the observation builder computes it
    want = np.float32(sp.kv_tokens) * np.float32(1.0 / max(sp.kv_tokens))
    np.testing.assert_array_equal(inst[:, -1], want)
    assert inst[1, -2] == 1.0 and inst[0, -2] < 1.0 and inst[1, -1] == 1.0
    np.testing.assert_array_equal(inst[:, -3], 1.0)       # free KV blocks / own blocks: all free
    # Counts are normalised by each instance's own max_num_seqs.
    assert base.obs_builder.scale[lay.global_dim + lay.num_candidates * lay.candidate_dim] == np.float32(1 / 128)
    assert base.obs_builder.scale[lay.global_dim + lay.num_candidates * lay.candidate_dim + lay.instance_dim] == np.float32(1 / 64)
    d = gym.make("LLMCluster-v0", instances=MIXED, obs={"as_dict": True}, **SMALL)
    o, _ = d.reset(seed=0)
    assert o["speed"].shape == (4,) and o["kv_size"].shape == (4,)


def test_check_env_on_a_mixed_cluster():
    env = gym.make("LLMCluster-v0", instances=MIXED, **SMALL)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gym_check_env(env.unwrapped, skip_render_check=True)
    assert not [str(w.message) for w in caught if "is not within the observation space" not in str(w.message)]


def test_mixed_env_episode_accounts_for_every_request_and_is_deterministic():
    kw = dict(instances=MIXED, num_requests=200, arrival_rate_rps=60.0, check_invariants=True,
              action={"candidates": 2, "order": "shortest"})
    a, b = gym.make("LLMCluster-v0", **kw), gym.make("LLMCluster-v0", **kw)
    sa, sb = _stream(a, 7, 100000), _stream(b, 7, 100000)
    assert len(sa) == len(sb) and all(np.array_equal(x, y) for x, y in zip(sa, sb))
    m = a.unwrapped.metrics()
    assert m["completed"] + m["rejected"] == 200 and m["unfinished"] == 0
    used = set(a.unwrapped.cluster.table.instance)
    assert used <= {-1, 0, 1, 2, 3} and len(used - {-1}) == 4


# ----------------------------------------------------------------------------- Hydra
def test_mixed_experiment_composes_and_evaluates_in_debug_size(tmp_path):
    from hydra import compose, initialize_config_dir

    from llm_lb_gym.experiments._hydra import CONF_DIR, env_kwargs
    from llm_lb_gym.experiments.evaluate import evaluate

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[
            "experiment=[mixed_a100_v100,debug]", "episodes=2", "policies=[round_robin,jsq]",
            "plot=false", "progress=false"])
        cli = compose(config_name="evaluate", overrides=[
            "env.instances=[{preset: llama2-7b-a100, count: 1}, {preset: llama2-7b-v100, count: 2}]"])
        clash = compose(config_name="evaluate", overrides=["experiment=paper_v100",
                                                           "env.instances=[{count: 2}]"])
    kw = env_kwargs(cfg)
    assert kw["num_instances"] is None and [g["count"] for g in kw["instances"]] == [2, 2]
    env = gym.make("LLMCluster-v0", **kw)
    assert env.unwrapped.cluster_cfg.describe() == f"2 x {A100} + 2 x {V100}"
    assert env.unwrapped.m == len(env.unwrapped.speeds.kv_tokens) == 4
    assert gym.make("LLMCluster-v0", **env_kwargs(cli)).unwrapped.cluster_cfg.describe() == f"1 x {A100} + 2 x {V100}"
    with pytest.raises(ConfigError, match=r"num_instances=4 and instances \(2 instances in 1 groups\) disagree"):
        gym.make("LLMCluster-v0", **env_kwargs(clash))
    res = evaluate(cfg, out=tmp_path)
    rows = res["rows"]
    assert len(rows) == 4 and all(r["completed"] + r["rejected"] == 60 for r in rows)
    assert f"2 x {A100} + 2 x {V100}" in (tmp_path / "summary.md").read_text()


def test_equivariant_network_reads_each_instance_speed_in_its_own_row():
    """The learned router's set network sees speed and kv_size in every instance row: swapping
    the rows of an A100 and a V100 swaps their action values (and nothing else)."""
    import torch as th

    from llm_lb_gym.agents.equivariant import InstanceSetQ

    env = gym.make("LLMCluster-v0", instances=MIXED, action={"candidates": 2, "order": "shortest"},
                   obs={"features": ("free_kv_blocks",)}, **SMALL)
    obs, _ = env.reset(seed=1)
    lay = env.unwrapped.obs_layout
    th.manual_seed(0)
    net = InstanceSetQ(lay.as_dict(), embed_dim=8, hidden=(16,)).double()
    x = th.tensor(obs, dtype=th.float64)[None]
    inst0 = lay.global_dim + lay.num_candidates * lay.candidate_dim
    rows = x[0, inst0:].reshape(lay.num_instances, lay.instance_dim)
    assert rows[0, -2] == 1.0 and rows[3, -2] < 1.0          # speed column: A100 first, V100 last
    swapped = x.clone()
    swapped[0, inst0:] = rows[[3, 1, 2, 0]].reshape(-1)
    q, qs = net(x)[0], net(swapped)[0]
    m = lay.num_instances
    perm = [3, 1, 2, 0]
    for j in range(lay.num_candidates):
        assert th.allclose(qs[j * m:(j + 1) * m], q[j * m:(j + 1) * m][perm])
    assert th.allclose(qs[-1], q[-1])
    assert not th.allclose(q[0], q[3])   # the two instance types get different values
