"""Latency SLOs (issue 13, item 4): deadline config, attainment and goodput worked by hand, the
slo reward's return identity, the slo_aware router, and the SLO columns of the result tables."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs import LLMClusterEnv
from llm_lb_gym.routers import make_router
from llm_lb_gym.routers.drive import decide
from llm_lb_gym.rollout import make_env_router, rollout_router
from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.latency import PRESETS, LatencyModel
from llm_lb_gym.sim.metrics import SLO_METRIC_KEYS, episode_metrics
from llm_lb_gym.sim.request import RequestTable
from llm_lb_gym.sim.slo import SLOConfig, isolated_decode_step_s, request_deadlines

from test_semi_mdp import SMALL, _env_return

# Iteration = 1 + prompt/8 (prefill) or 1 + B/4 (decode): the hand-worked model of test_reference.
SIMPLE = LatencyModel(base_s=1.0, token_s=0.125, prefill_attn_s=0.0,
                      decode_seq_s=0.125, decode_ctx_s=0.0)


# ----------------------------------------------------------------------------- configuration
def test_default_is_five_times_isolated_for_both():
    cfg = SLOConfig()
    assert (cfg.ttft.basis, cfg.ttft.value, cfg.tbt.basis, cfg.tbt.value) == ("multiple", 5.0, "multiple", 5.0)
    assert LLMClusterEnv(num_requests=5).cfg.slo == cfg


@pytest.mark.parametrize("options,match", [
    ({"ttft_s": 2.0}, r"slo.ttft_s=2.0 and slo.ttft_multiple=5.0 are both set; allowed: one of them"),
    ({"tbt_multiple": -1.0}, r"slo.tbt_multiple=-1.0 is out of range; allowed: \(0.0, inf\)"),
    ({"tbt_multiple": "fast"}, r"slo.tbt_multiple='fast' is not a number"),
    ({"ttft_multiple": None, "tbt_multiple": None}, r"no deadline set .*allowed: at least one, or slo=null"),
    ({"ttft_multiple": {"chat": 0.0}}, r"slo.ttft_multiple\[chat\]=0.0 is out of range"),
    ({"ttft_multiple": {}}, r"slo.ttft_multiple=\{\} is empty; allowed"),
    ({"tbt_ms": 50}, r"unknown slo option\(s\): tbt_ms; allowed: tbt_multiple, tbt_s, ttft_multiple, ttft_s"),
])
def test_deadline_config_errors_name_option_and_allowed_values(options, match):
    with pytest.raises(ConfigError, match=match):
        SLOConfig.build(options)


def test_per_task_deadlines_must_match_the_workload_tasks():
    tasks = LLMClusterEnv(num_requests=5).workload.task_names
    with pytest.raises(ConfigError, match=r"slo.ttft_s names unknown task\(s\) chat; allowed: the workload's tasks " + ", ".join(tasks)):
        LLMClusterEnv(num_requests=5, slo={"ttft_s": {"chat": 1.0}, "ttft_multiple": None})
    with pytest.raises(ConfigError, match=r"slo.tbt_multiple has no value for task\(s\) " + ", ".join(tasks[1:])):
        LLMClusterEnv(num_requests=5, slo={"tbt_multiple": {tasks[0]: 3.0}})
    env = LLMClusterEnv(num_requests=50, slo={"ttft_s": {t: 1.0 + i for i, t in enumerate(tasks)},
                                              "ttft_multiple": None, "tbt_multiple": None})
    env.reset(seed=0)
    tb = env.cluster.table
    assert tb.ttft_deadline_s == [1.0 + t for t in tb.task_id]
    assert all(x == math.inf for x in tb.tbt_deadline_s)


def test_slo_reward_needs_deadlines():
    with pytest.raises(ConfigError, match=r"reward.slo_reward=1.0 needs deadlines; allowed: slo set"):
        LLMClusterEnv(slo=None, reward={"slo_reward": 1.0})
    with pytest.raises(ConfigError, match=r"reward.slo_reward=-1 is out of range"):
        LLMClusterEnv(reward={"slo_reward": -1})


def test_multiples_use_the_latency_model_isolated_times():
    ttft, tbt = request_deadlines(SLOConfig(ttft_multiple=2.0, tbt_multiple=3.0), SIMPLE,
                                  [8, 4], [4, 1], [0, 0], ("default",))
    # Isolated prefill of 8 tokens: 1 + 8/8 = 2 s; a lone decode step is 1 + 1/4 = 1.25 s.
    assert ttft.tolist() == [4.0, 3.0] and tbt.tolist() == [3.75, 3.75]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_isolated_decode_step_is_a_lone_first_decode_and_ignores_the_output_length(preset):
    lat = PRESETS[preset].latency
    p = np.array([1, 100, 3000])
    want = [lat.iteration_s(decode_seqs=1, decode_ctx_tokens=int(x) + 1) for x in p]
    np.testing.assert_allclose(isolated_decode_step_s(lat, p), want, rtol=1e-12)
    # Alone, the first decode step is the request's shortest: its isolated TBT is at least that.
    assert all(lat.isolated_request_s(int(x), 50) - lat.prefill_s(int(x)) >= 49 * w for x, w in zip(p, want))
    cfg = SLOConfig(ttft_multiple=3.0, tbt_multiple=3.0)
    a = request_deadlines(cfg, lat, p, [1, 1, 1], np.zeros(3, int), ("x",))
    b = request_deadlines(cfg, lat, p, [900, 5, 2000], np.zeros(3, int), ("x",))
    assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()


def test_isolated_ttft_counts_the_frontend_and_the_scheduling_the_engine_has():
    """Behind an API server the isolated TTFT is the frontend's delay and input work plus the
    prefill (the engine-side first token the SLO check reads); under async scheduling each
    isolated iteration is the longer of its GPU side and CPU step. Without either: the prefill,
    bit for bit as before."""
    from llm_lb_gym.sim.frontend import FrontendModel
    from llm_lb_gym.sim.slo import isolated_ttft_s

    lat = LatencyModel(base_s=0.002, token_s=2e-5, decode_ctx_s=1e-7, cpu_base_s=4e-3, cpu_seq_s=1e-4)
    fe = FrontendModel(delay_s=0.03, request_s=0.01, prompt_token_s=1e-6, first_token_s=0.002)
    p = np.array([10, 100, 1000])
    assert np.asarray(isolated_ttft_s(lat, p)).tolist() == [lat.prefill_s(int(x)) for x in p]
    np.testing.assert_allclose(isolated_ttft_s(lat, p, fe), [0.03 + 0.01 + 1e-6 * x + lat.prefill_s(int(x)) for x in p],
                               rtol=1e-12)
    gpu = lat.without_cpu()
    np.testing.assert_allclose(isolated_ttft_s(lat, p, None, True),
                               [max(gpu.prefill_s(int(x)), 4e-3 + 1e-4) for x in p], rtol=1e-12)
    np.testing.assert_allclose(isolated_decode_step_s(lat, p, True),
                               [max(gpu.iteration_s(decode_seqs=1, decode_ctx_tokens=int(x) + 1), 4e-3 + 1e-4) for x in p],
                               rtol=1e-12)
    ttft, _ = request_deadlines(SLOConfig(ttft_multiple=5.0), lat, p, [2, 2, 2], np.zeros(3, int), ("x",), fe)
    np.testing.assert_allclose(ttft, 5.0 * np.asarray(isolated_ttft_s(lat, p, fe)), rtol=1e-12)


def test_slo_attainment_tells_routers_apart_behind_an_api_server():
    """The vLLM V1 preset (Llama-3.1-8B on an H100, its ~30 ms of API-server latency per
    request) at light load: most requests meet 5x their isolated TTFT and TBT, which they could
    not when the isolated TTFT left the frontend out (2% under every router)."""
    env = LLMClusterEnv(num_instances=2, num_requests=200, arrival_rate_rps=4.0,
                        engine={"model_config": "llama3.1-8b", "gpu": "h100-80gb", "latency_fit": "serving",
                                "frontend": "vllm-v1-api", "chunked_prefill": True, "kv_allocation": "chunk",
                                "max_num_batched_tokens": 8192, "max_num_seqs": 1024, "max_model_len": 8192})
    m = rollout_router(env, make_env_router("round_robin", env), seed=0).metrics
    assert m["completed"] == 200 and m["slo_attainment_pct"] > 50.0, m["slo_attainment_pct"]


# ----------------------------------------------------------------------- hand-worked metrics
def _two_requests_and_a_reject(slo: SLOConfig, fast: bool = True) -> RequestTable:
    """A: p=8, d=4 at 0; C: p=5000 at 1.0 (beyond the 4,096-token context: rejected); B: p=4, d=3
    at 2.5; one instance, each routed on arrival. test_reference's two-request scenario:
    A prefill 0-2 (first token 2.0), decode 2-3.25, B prefill 3.25-4.75 (first token 4.75),
    two decodes of A and B 4.75-7.75: both finish at 7.75."""
    arrival, prompt, decode = [0.0, 1.0, 2.5], [8, 5000, 4], [4, 1, 3]
    ttft, tbt = request_deadlines(slo, SIMPLE, prompt, decode, [0, 0, 0], ("default",))
    table = RequestTable(arrival, prompt, decode, decode, ttft_deadline_s=ttft, tbt_deadline_s=tbt,
                         count_slo=True)
    engine = EngineConfig(block_size=4, num_kv_blocks=1000, watermark=0.0, latency=SIMPLE)
    c = Cluster(ClusterConfig(1, engine, fast=fast), table, check=True)
    for t in arrival:
        c.advance_to(t)
        while c.queue:
            c.route(0)
    c.run_to_completion()
    assert (table.first_token_s[0], table.first_token_s[2]) == (2.0, 4.75) and math.isnan(table.first_token_s[1])
    assert (table.finish_s[0], table.finish_s[2], table.reject_reason[1]) == (7.75, 7.75, "exceeds_max_model_len")
    assert c.n_slo_met == episode_metrics(table)["slo_met"]   # the engine's count = the metrics'
    assert c.n_slo_met > 0
    return table


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "step"])
def test_attainment_and_goodput_by_hand(fast):
    # TTFT: A 2.0 vs 1.4 x 2.0 = 2.8 (met); B 4.75 - 2.5 = 2.25 vs 1.4 x 1.5 = 2.1 (missed).
    # TBT: A (7.75 - 2) / 3 = 1.9167, B (7.75 - 4.75) / 2 = 1.5, both vs 1.6 x 1.25 = 2.0 (met)
    # (a lone decode step is 1 + 1/4 = 1.25 s).
    # C was rejected: a miss of both. Makespan 0 .. 7.75 s.
    m = episode_metrics(_two_requests_and_a_reject(SLOConfig(ttft_multiple=1.4, tbt_multiple=1.6), fast))
    assert m["slo_met"] == 1
    assert m["slo_attainment_pct"] == pytest.approx(100 / 3)
    assert m["slo_ttft_attainment_pct"] == pytest.approx(100 / 3)
    assert m["slo_tbt_attainment_pct"] == pytest.approx(200 / 3)
    assert m["goodput_rps"] == pytest.approx(1 / 7.75) and m["throughput_rps"] == pytest.approx(2 / 7.75)


def test_deadlines_are_inclusive_and_tbt_only():
    # B's TTFT 2.25 equals 1.5 x 1.5 exactly: met. TBT deadline 1.5 s absolute: B (1.5) met,
    # A (1.9167) missed; no TTFT deadline at all.
    m = episode_metrics(_two_requests_and_a_reject(SLOConfig(ttft_multiple=1.5, tbt_multiple=1.6)))
    assert m["slo_met"] == 2
    m = episode_metrics(_two_requests_and_a_reject(SLOConfig(ttft_multiple=None, tbt_s=1.5, tbt_multiple=None)))
    assert (m["slo_met"], m["slo_ttft_attainment_pct"]) == (1, pytest.approx(200 / 3))


def test_metrics_without_deadlines_have_no_slo_keys():
    env = LLMClusterEnv(slo=None, **SMALL)
    m = rollout_router(env, make_env_router("round_robin", env), 0).metrics
    assert not set(SLO_METRIC_KEYS) & set(m)
    env = LLMClusterEnv(**SMALL)
    m = rollout_router(env, make_env_router("round_robin", env), 0).metrics
    assert set(SLO_METRIC_KEYS) <= set(m) and 0 < m["slo_attainment_pct"] < 100


# ------------------------------------------------------------------------------ slo reward
SLO_REWARD = {"mode": "baseline", "penalty_scale": 0.0, "completion_reward": 0.0, "slo_reward": 1.0}


@pytest.mark.parametrize("router", ["round_robin", "jsq", "slo_aware"])
def test_undiscounted_slo_return_is_the_requests_meeting_their_slo(router):
    """Per-step discount 1: no weights inside a step either, so the return is exactly
    slo_reward x (requests within both deadlines) = slo_reward x N x attainment / 100."""
    env = LLMClusterEnv(reward={**SLO_REWARD, "discount": "per_step", "gamma": 1.0},
                        slo={"ttft_multiple": 4.0, "tbt_multiple": 2.0}, **SMALL)
    res = rollout_router(env, make_env_router(router, env), 3)
    m = res.metrics
    assert 0 < m["slo_met"] < SMALL["num_requests"]    # a test that can fail either way
    assert res.episode_return == m["slo_met"] == env.cluster.n_slo_met
    assert res.episode_return == pytest.approx(SMALL["num_requests"] * m["slo_attainment_pct"] / 100)


@pytest.mark.parametrize("router", ["round_robin", "slo_aware"])
def test_discounted_slo_return_equals_the_interval_by_interval_definition(router):
    """Semi-MDP: sum over grid points j of exp(-(j - 1) dt / H) x (requests meeting their SLO
    that finished by point j but not by point j - 1), computed on the bare cluster."""
    horizon = 5.0
    env = LLMClusterEnv(reward={**SLO_REWARD, "horizon_s": horizon}, action={"mask_idle_defer": False},
                        slo={"ttft_multiple": 4.0, "tbt_multiple": 2.0}, **SMALL)
    got, _ = _env_return(env, router, 3)
    env.reset(seed=3)
    c = env.cluster
    r = make_env_router(router, env)
    r.reset(np.random.default_rng([3, 7]), env.m)
    dt = env.cfg.decision_interval_s
    want, j, met = 0.0, 0, 0
    while not (c.all_arrived and not c.queue and c.done):
        while c.queue:
            choice = decide(c, r)
            if choice is None:
                break
            c.route(choice[1], choice[0])
        j += 1
        c.tick(j * dt)
        want += math.exp(-(j - 1) * dt / horizon) * (c.n_slo_met - met)
        met = c.n_slo_met
    assert 0 < met < SMALL["num_requests"]
    assert got == pytest.approx(want, rel=1e-9)


def test_slo_reward_component_in_info():
    env = LLMClusterEnv(reward=SLO_REWARD, **SMALL)
    env.reset(seed=1)
    seen = 0.0
    for _ in range(100_000):
        _, r, term, _, info = env.step(0 if env.action_masks()[0] else env.defer_action)
        assert info["reward_components"]["slo"] == pytest.approx(r, abs=1e-12)
        seen += r
        if term:
            break
    assert term and seen > 0


# ---------------------------------------------------------------------------- slo_aware
def _cluster(m, rows, routes, slo=SLOConfig(ttft_multiple=10.0, tbt_multiple=10.0)):
    """rows of (prompt, decode) all arriving at 0; the first len(routes) routed as given."""
    p = [r[0] for r in rows]
    d = [r[1] for r in rows]
    ttft, tbt = request_deadlines(slo, SIMPLE, p, d, [0] * len(p), ("default",))
    table = RequestTable([0.0] * len(p), p, d, d, ttft_deadline_s=ttft, tbt_deadline_s=tbt)
    engine = EngineConfig(block_size=4, num_kv_blocks=1000, watermark=0.0, latency=SIMPLE)
    c = Cluster(ClusterConfig(m, engine), table)
    c.advance_to(0.0)
    for i in routes:
        c.route(i)
    return c


def _pick(c, **options):
    r = make_router("slo_aware", **options)
    r.reset(np.random.default_rng(0), len(c.engines))
    return r.select(c, c.queue[0])


def test_slo_aware_avoids_a_saturated_instance():
    # Instance 0 holds ten queued requests of 64-token prompts; a new 8-token request would wait
    # for 640 tokens of prefill there (>= 81 s), far past its 10 x 2 s TTFT deadline; instance 1
    # is idle. Every load-blind tie-break (lowest index) would pick 0.
    c = _cluster(2, [(64, 8)] * 10 + [(8, 4)], [0] * 10)
    assert _pick(c) == 1
    assert _pick(c, pick="least_headroom") == 1   # packing still never picks a predicted miss


def test_slo_aware_prefers_the_fast_idle_instance():
    # Two idle instances; instance 1's latency model is 4x faster: more headroom there.
    c = _cluster(2, [(8, 4)], [])
    fast = LatencyModel(base_s=0.25, token_s=0.125 / 4, prefill_attn_s=0.0,
                        decode_seq_s=0.125 / 4, decode_ctx_s=0.0)
    c.engines[1].latency = fast
    assert _pick(c) == 1
    c.engines[0].latency, c.engines[1].latency = fast, SIMPLE
    assert _pick(c) == 0


def test_slo_aware_packs_with_least_headroom_and_takes_the_smallest_violation():
    # Instance 0 has one queued 16-token request, instance 1 none: both meet a 10x deadline.
    c = _cluster(2, [(16, 4), (8, 4)], [0])
    assert _pick(c) == 1 and _pick(c, pick="least_headroom") == 0
    # A 1.01x TTFT deadline: no instance meets it (the request already waits behind nothing on 1,
    # but the tolerance is below one iteration); the smaller violation (instance 1) wins.
    c = _cluster(2, [(16, 4), (8, 4)], [0], SLOConfig(ttft_multiple=1.01, tbt_multiple=1.01))
    c.advance_to(0.5)
    assert _pick(c) == 1


def test_slo_aware_on_miss_parks_a_hopeless_request():
    # A 1.01x deadline nobody meets at t = 0.5 (0.5 s waited + a 2 s prefill > 1.01 x 2 s):
    # instance 0 has four queued requests, 1 one, 2 none: least_violation picks the idle one,
    # largest_violation the longest queue.
    c = _cluster(3, [(64, 8)] * 4 + [(16, 4), (8, 4)], [0, 0, 0, 0, 1],
                 SLOConfig(ttft_multiple=1.01, tbt_multiple=1.01))
    c.advance_to(0.5)
    assert _pick(c) == 2 and _pick(c, on_miss="largest_violation") == 0
    with pytest.raises(ConfigError, match=r"router.slo_aware.on_miss='park' is not valid; allowed: "
                                          r"least_violation, largest_violation"):
        make_router("slo_aware", on_miss="park")
    with pytest.raises(ConfigError, match=r"router.slo_aware.slo_buffer=0.5 is out of range"):
        make_router("slo_aware", slo_buffer=0.5)


def test_slo_aware_without_deadlines_takes_the_lowest_predicted_latency():
    c = _cluster(3, [(64, 8)] * 3 + [(8, 4)], [0, 0, 1])
    c.table.slo_on = False
    assert _pick(c) == 2


def test_slo_aware_beats_round_robin_on_attainment_near_capacity():
    """Not a benchmark: three paired episodes at 52 req/s where round robin meets the 5x
    deadlines for about half the requests; docs/slo.md has the 20-episode figures."""
    env = LLMClusterEnv(num_requests=600, arrival_rate_rps=52.0)
    att = {r: [rollout_router(env, make_env_router(r, env), s).metrics["slo_attainment_pct"]
               for s in range(3)] for r in ("round_robin", "slo_aware")}
    assert np.mean(att["slo_aware"]) > np.mean(att["round_robin"])


# ------------------------------------------------------------------------------- tables
def test_tables_carry_attainment_and_goodput():
    from llm_lb_gym.experiments.evaluate import summarize
    from llm_lb_gym.experiments.load_sweep import _sweep_table
    from llm_lb_gym.experiments.reproduce import paper_table

    def row(policy, seed, att, good, e2e=2.0):
        return {"policy": policy, "seed": seed, "num_requests": 100, "completed": 100, "rejected": 0,
                "unfinished": 0, "mean_e2e_s": e2e, "p99_e2e_s": 5.0, "mean_ttft_s": 0.1,
                "p99_ttft_s": 0.5, "mean_tbt_s": 0.03, "p99_tbt_s": 0.05, "preemptions": 0,
                "mean_router_wait_s": 0.01, "slo_attainment_pct": att, "goodput_rps": good}

    rows = [row("round_robin", 0, 50.0, 5.0), row("round_robin", 1, 60.0, 6.0),
            row("slo_aware", 0, 55.0, 5.5), row("slo_aware", 1, 70.0, 7.0)]
    table = summarize(rows, "round_robin")
    head = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    cells = dict(zip(head, [c.strip() for c in table.splitlines()[3].strip("|").split("|")]))
    assert cells["SLO met (%)"] == "62.5" and cells["goodput (req/s)"] == "6.25"
    assert cells["SLO met vs round_robin (points, 95% CI)"].startswith("+7.50 ± ")
    assert len({line.count("|") for line in table.splitlines()}) == 1
    for t in (paper_table(rows, {}, {}, {}), _sweep_table([(1.5, 52.0, {"rows": rows})], "round_robin")):
        assert "SLO met (%)" in t and "goodput (req/s)" in t
        assert len({line.count("|") for line in t.splitlines()}) == 1
    no_slo = [{k: v for k, v in r.items() if k not in ("slo_attainment_pct", "goodput_rps")} for r in rows]
    assert "| n/a | n/a |" in summarize(no_slo, "round_robin")


def test_evaluate_counts_rejected_and_unfinished_requests_as_misses(tmp_path, monkeypatch):
    """An evaluation where a third of the requests can never run (rejected) and an agent that
    only defers until its step limit (all unfinished): both show in the SLO columns."""
    import llm_lb_gym.agents.factory
    from llm_lb_gym.experiments.evaluate import evaluate

    from test_tables import _cells, _Deferrer, _eval_cfg, _long_context_trace

    workload = {"name": "trace", "path": str(_long_context_trace(tmp_path)), "format": "mooncake",
                "rate_scale": 2.0, "start": "head"}
    ev = evaluate(_eval_cfg(tmp_path, workload), out=tmp_path / "a")
    rr = _cells(ev["table"], "round_robin")
    assert rr["rejected"] == "20" and 0.0 < float(rr["SLO met (%)"]) <= 100 * 10 / 30
    monkeypatch.setattr(llm_lb_gym.agents.factory, "load_agent", lambda kind, path, env=None: _Deferrer())
    cfg = _eval_cfg(tmp_path, {"name": "task_mix"}, max_episode_steps=8,
                    action={"masked": "as_taken"})   # its defers taken as given (no fallback)
    cfg.agents = {"deferrer": {"kind": "dqn", "path": "unused"}}
    table = evaluate(cfg, out=tmp_path / "b")["table"]
    cells = _cells(table, "deferrer")
    assert (cells["unfinished"], cells["SLO met (%)"], cells["goodput (req/s)"]) == ("30", "0.0", "0.00")
    assert float(_cells(table, "round_robin")["SLO met (%)"]) > 50
