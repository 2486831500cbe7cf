"""Instances sharing one machine's cores (``sim/shared_host.py``): hand-worked cases on one
core, work conservation, and the plain cluster when the cores suffice."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.routers.drive import run_router
from llm_lb_gym.routers.registry import make_router
from llm_lb_gym.serve.llamacpp_sim import llamacpp_engine_config
from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.frontend import resolve_frontend
from llm_lb_gym.sim.latency import LatencyModel
from llm_lb_gym.sim.metrics import episode_metrics
from llm_lb_gym.sim.request import RequestTable
from llm_lb_gym.sim.shared_host import SharedHost, SharedHostCluster
from llm_lb_gym.workload import make_workload

SIMPLE = LatencyModel(base_s=1.0, token_s=0.125, prefill_attn_s=0.0, decode_seq_s=0.125, decode_ctx_s=0.0)
ENGINE = EngineConfig(block_size=4, num_kv_blocks=200, watermark=0.0, latency=SIMPLE, cpu_overhead=False)


def run(arrivals, prompts, decodes, instances, host=None, engine=ENGINE, fast=True):
    """Route request k to ``instances[k]`` at its arrival; returns the cluster, run to the end."""
    table = RequestTable(arrivals, prompts, decodes, decodes)
    cfg = ClusterConfig(num_instances=max(instances) + 1, engine=engine, fast=fast)
    cluster = Cluster(cfg, table) if host is None else SharedHostCluster(cfg, table, host)
    for k in range(table.n):
        cluster.advance_to(table.arrival_s[k])
        cluster.route(instances[k])
    cluster.run_to_completion()
    assert cluster.done
    return cluster


def test_two_instances_on_one_core_take_twice_as_long():
    plain = run([0.0, 0.0], [8, 8], [4, 4], [0, 1]).table
    shared = run([0.0, 0.0], [8, 8], [4, 4], [0, 1], SharedHost(cores=1)).table
    for col in ("first_scheduled_s", "first_token_s", "finish_s"):
        assert getattr(shared, col) == pytest.approx([2 * x for x in getattr(plain, col)], rel=1e-12)
    # 3 runnable threads on 2 cores (a busy loop beside both): each at 2/3 of a core
    third = run([0.0, 0.0], [8, 8], [4, 4], [0, 1], SharedHost(cores=2, background_threads=1)).table
    assert third.finish_s == pytest.approx([1.5 * x for x in plain.finish_s], rel=1e-12)


def test_a_second_instance_halves_the_first_ones_speed_from_its_arrival_on():
    """A alone on the core until B arrives at x, then both at half speed until A is done, then
    B alone: A ends at x + 2 (W_A - x) and B at W_A + W_B (one core, all work conserved)."""
    w_a = run([0.0], [8], [6], [0]).table.finish_s[0]
    w_b = run([0.0], [4], [12], [0]).table.finish_s[0]
    x = 2.5
    assert x < w_a and w_a - x < w_b
    shared = run([0.0, x], [8, 4], [6, 12], [0, 1], SharedHost(cores=1))
    assert shared.table.finish_s[0] == pytest.approx(x + 2 * (w_a - x), rel=1e-12)
    assert shared.table.finish_s[1] == pytest.approx(w_a + w_b, rel=1e-12)
    assert shared.table.routed_s == [0.0, x]   # routing times are real times
    # busy real / work: A was busy W_A of work over x + 2 (W_A - x) real seconds
    assert shared.busy_work_s[0] == pytest.approx(w_a, rel=1e-12)
    assert shared.busy_real_s[0] == pytest.approx(x + 2 * (w_a - x), rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 30), st.integers(0, 2)), min_size=1, max_size=12))
def test_a_burst_on_one_core_ends_after_all_the_instances_work(reqs):
    """Everything routed at t = 0 onto one core: the core is busy until the last request ends,
    so that end is the sum of each instance's busy time alone, and each instance's own order of
    events is kept."""
    prompts, decodes, inst = (list(x) for x in zip(*reqs))
    arrivals = [0.0] * len(reqs)
    plain = run(arrivals, prompts, decodes, inst)
    shared = run(arrivals, prompts, decodes, inst, SharedHost(cores=1))
    alone = sum(max((plain.table.finish_s[k] for k in range(len(reqs)) if inst[k] == i), default=0.0)
                for i in range(max(inst) + 1))
    assert max(shared.table.finish_s) == pytest.approx(alone, rel=1e-9)
    for i in range(max(inst) + 1):
        ks = [k for k in range(len(reqs)) if inst[k] == i]
        assert sorted(ks, key=lambda k: plain.table.finish_s[k]) == sorted(ks, key=lambda k: shared.table.finish_s[k])
        assert shared.busy_work_s[i] == pytest.approx(plain.engines[i].t if ks else 0.0, rel=1e-9)
    for k in range(len(reqs)):
        assert shared.table.finish_s[k] >= plain.table.finish_s[k] - 1e-9


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 30), st.integers(1, 40), st.integers(1, 30), st.integers(0, 2)),
                min_size=1, max_size=12),
       st.floats(0.5, 3.0), st.floats(0.0, 2.0))
def test_fast_and_step_by_step_engines_agree_and_slowdowns_stay_in_bounds(reqs, cores, background):
    reqs = sorted(reqs)
    arrivals, prompts, decodes, inst = (list(x) for x in zip(*reqs))
    host = SharedHost(cores=cores, background_threads=background)
    fast = run(arrivals, prompts, decodes, inst, host)
    step = run(arrivals, prompts, decodes, inst, host, fast=False)
    assert fast.table.finish_s == pytest.approx(step.table.finish_s, rel=1e-9)
    assert fast.table.first_token_s == pytest.approx(step.table.first_token_s, rel=1e-9)
    slowest = 1.0 / host.rate(max(inst) + 1)
    for i in range(max(inst) + 1):
        if fast.busy_work_s[i] > 0:
            ratio = fast.busy_real_s[i] / fast.busy_work_s[i]
            assert 1.0 - 1e-9 <= ratio <= slowest + 1e-9
    tb = fast.table
    for k in range(tb.n):
        assert tb.arrival_s[k] <= tb.first_scheduled_s[k] <= tb.first_token_s[k] <= tb.finish_s[k]


@pytest.mark.parametrize("router,interval", [("round_robin", 0.0), ("least_requests", 0.0), ("late_binding", 0.02)])
def test_enough_cores_give_the_plain_cluster(router, interval):
    """With a core per instance and per background thread nothing slows down: the times are
    the plain cluster's (to rounding), through the router driver, a decision grid and a frontend."""
    eng = replace(llamacpp_engine_config(4, 4096), frontend=resolve_frontend("llamacpp-server"))
    batch = make_workload("task_mix", max_context_tokens=1024, rate_rps=2.0, length_scale=0.2,
                          max_prompt_tokens=200).sample(np.random.default_rng(3), 50)
    cfg = ClusterConfig(num_instances=2, engine=eng)
    plain = run_router(batch, cfg, make_router(router), np.random.default_rng(0), interval)
    for fe in plain.table.frontends:   # the client-side times of the last requests (the shared
        fe.flush()                     # host's run_to_completion flushes before mapping them)
    shared = run_router(batch, cfg, make_router(router), np.random.default_rng(0), interval,
                        host=SharedHost(cores=3, background_threads=0.5))
    assert isinstance(shared, SharedHostCluster)
    for col in ("routed_s", "first_token_s", "finish_s", "seen_first_token_s", "seen_finish_s"):
        assert getattr(shared.table, col) == pytest.approx(getattr(plain.table, col), rel=1e-9, abs=1e-12)
    assert shared.table.instance == plain.table.instance
    slow = run_router(batch, cfg, make_router(router), np.random.default_rng(0), interval,
                      host=SharedHost(cores=2, background_threads=1.0))
    assert episode_metrics(slow.table)["mean_e2e_s"] > episode_metrics(plain.table)["mean_e2e_s"]
    assert episode_metrics(slow.table)["completed"] == batch.arrival_s.size


def test_bad_host_and_the_env_grid_are_refused_with_their_names():
    with pytest.raises(ConfigError, match="host.cores"):
        SharedHost(cores=0)
    with pytest.raises(ConfigError, match="host.background_threads"):
        SharedHost(cores=2, background_threads=-1)
    with pytest.raises(ConfigError, match="SharedHost"):
        SharedHostCluster(ClusterConfig(num_instances=1, engine=ENGINE), RequestTable([0.0], [4], [4], [4]), 2)
    c = SharedHostCluster(ClusterConfig(num_instances=1, engine=ENGINE), RequestTable([0.0], [4], [4], [4]),
                          SharedHost(cores=1))
    with pytest.raises(ConfigError, match="run_router"):
        c.tick(1.0)
    assert math.isclose(SharedHost(cores=2, background_threads=1).rate(2), 2 / 3)
