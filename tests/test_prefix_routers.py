"""Prefix-affinity routers: they follow the cached prefix, yield to load, and the approximate
one never reads the engines' caches."""

from __future__ import annotations

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.routers import make_router, run_router
from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.metrics import prefix_cache_metrics
from llm_lb_gym.sim.request import RequestTable
from llm_lb_gym.workload.registry import make_workload

CHAINS = [tuple(range(10)), tuple(range(8)) + (50, 51), tuple(range(100, 110))]


def _cluster(pc=True):
    table = RequestTable([0.0, 5.0, 5.0], [160, 160, 160], [4, 4, 4], [4, 4, 4],
                         prefix_hashes=CHAINS, hash_block_tokens=16)
    cfg = ClusterConfig(num_instances=3, engine=EngineConfig(enable_prefix_caching=pc))
    return Cluster(cfg, table)


def _route_first_to(cluster, router, i):
    cluster.advance_to(0.0)
    cluster.route(i)
    cluster.advance_to(5.0)   # request 0 finished long ago: its blocks are cached on i
    assert cluster.engines[i].cached_prefix_tokens(1) == 8 * 16


@pytest.mark.parametrize("name", ["prefix_affinity", "prefix_affinity_approx"])
def test_follows_the_cached_prefix(name):
    c = _cluster()
    r = make_router(name)
    r.reset(np.random.default_rng(0), 3)
    if name == "prefix_affinity_approx":   # it learns where request 0 went from its own choice
        c.advance_to(0.0)
        c.engines[0].used = c.engines[1].used = 100   # idle instances made to look busy once
        i0 = r.select(c, 0)
        c.engines[0].used = c.engines[1].used = 0
        c.route(i0)
        c.advance_to(5.0)
    else:
        i0 = 2
        _route_first_to(c, r, i0)
    assert i0 == 2
    assert r.select(c, 1) == 2    # shares 8 of 10 blocks with request 0: affinity wins the tie
    assert r.select(c, 2) == 0    # nothing in common: equal scores, lowest index


def test_load_outweighs_affinity_with_a_large_weight():
    c = _cluster()
    _route_first_to(c, None, 1)
    e = c.engines[1]
    e.used = e.total_blocks // 2   # pretend instance 1 is half full (read by the load term)
    near = make_router("prefix_affinity", load_weight=0.5)
    far = make_router("prefix_affinity", load_weight=10.0)
    for r in (near, far):
        r.reset(np.random.default_rng(0), 3)
    assert near.select(c, 1) == 1 and far.select(c, 1) == 0


def test_approx_never_reads_the_engine_cache(monkeypatch):
    from llm_lb_gym.sim import engine as engine_mod

    def forbidden(self, rid):
        raise AssertionError("prefix_affinity_approx read the engine's cache")

    batch = make_workload("conversation", rate_rps=6.0).sample(np.random.default_rng(0), 300)
    cfg = ClusterConfig(num_instances=3, engine=EngineConfig(enable_prefix_caching=True))
    monkeypatch.setattr("llm_lb_gym.sim._compiled.engine_class", lambda: engine_mod.Engine)
    monkeypatch.setattr(engine_mod.Engine, "cached_prefix_tokens", forbidden)
    c = run_router(batch, cfg, make_router("prefix_affinity_approx"), np.random.default_rng(0))
    assert c.done and prefix_cache_metrics(c.engines)["prefix_hit_rate"] > 0.3


def test_prefix_routers_beat_round_robin_hit_rate_on_conversations():
    batch = make_workload("conversation", rate_rps=6.0).sample(np.random.default_rng(1), 600)
    cfg = ClusterConfig(num_instances=4, engine=EngineConfig(enable_prefix_caching=True))
    hit = {}
    for name in ("round_robin", "prefix_affinity", "prefix_affinity_approx"):
        c = run_router(batch, cfg, make_router(name), np.random.default_rng(0), check=True)
        hit[name] = prefix_cache_metrics(c.engines)["prefix_hit_rate"]
    assert hit["prefix_affinity"] > hit["round_robin"] + 0.05
    assert hit["prefix_affinity_approx"] > hit["round_robin"] + 0.05


def test_options_are_validated():
    with pytest.raises(ConfigError, match="load_weight"):
        make_router("prefix_affinity", load_weight=-1.0)
    with pytest.raises(ConfigError, match="capacity_blocks"):
        make_router("prefix_affinity_approx", capacity_blocks=-3)
