"""The progress watchdog (``sim/watchdog.py``): a rollout that stops progressing stops, and says why.

Registered routers cannot stall (``routers/release.py``), so the stalls here come from what the
release guarantee does not cover: an agent that always defers and a router written to the bare
``Router`` protocol (not a ``RouterBase``). The bounds are lowered so each stall takes a second.
"""

from __future__ import annotations

import numpy as np
import pytest

import llm_lb_gym  # noqa: F401
from llm_lb_gym.envs.cluster_env import LLMClusterEnv
from llm_lb_gym.routers import make_router, run_router
from llm_lb_gym.routers.release import MAX_HOLD_S
from llm_lb_gym.rollout import rollout_agent, rollout_router
from llm_lb_gym.sim import watchdog
from llm_lb_gym.sim.watchdog import StalledRolloutError, Watchdog
from llm_lb_gym.workload.batch import RequestBatch


class AlwaysDefer:
    """An agent (SB3's ``predict``) that never routes."""

    def __init__(self, defer_action: int):
        self.defer_action = defer_action

    def predict(self, obs, deterministic=True):
        return self.defer_action, None


class BareHolder:
    """A router to the bare protocol (no ``RouterBase``, so no release guarantee) that holds."""

    name = "bare_holder"
    defers = True

    def reset(self, rng, num_instances):
        pass

    def select(self, cluster, rid):
        return None


def test_stall_s_is_twice_the_hold_cap():
    # A registered router releases the head within MAX_HOLD_S, and a route is progress.
    assert watchdog.STALL_S == 2 * MAX_HOLD_S


def test_an_agent_that_always_defers_is_stopped_with_a_report(monkeypatch):
    monkeypatch.setattr(watchdog, "STALL_S", 50.0)
    env = LLMClusterEnv(num_requests=20, action={"masked": "as_taken"})
    with pytest.raises(StalledRolloutError) as err:
        rollout_agent(env, AlwaysDefer(env.defer_action), seed=3)
    msg = str(err.value)
    assert msg.startswith("agent AlwaysDefer on seed 3 made no progress")
    assert "for 50.0" in msg and "held at the router" in msg and "STALL_S=50 s" in msg
    # exactly the requests that had arrived: every one held, none finished
    held = int(msg.split(" requests held at the router")[0].rsplit(" ", 1)[1])
    c = env.cluster
    assert held == c.n_arrived == len(c.queue) and c.n_finished == 0


def test_a_bare_protocol_router_is_stopped_in_every_driver(monkeypatch):
    monkeypatch.setattr(watchdog, "STALL_STEPS", 500)
    env = LLMClusterEnv(num_requests=10)
    with pytest.raises(StalledRolloutError, match=r"^router 'bare_holder' \(<.*BareHolder.*\) on seed 0 "
                                                  r"made no progress .* 501 steps"):
        rollout_router(env, BareHolder(), 0)
    b = RequestBatch.from_arrays([0.0, 1.0], [8, 8], [4, 4])
    from llm_lb_gym.sim.config import ClusterConfig

    with pytest.raises(StalledRolloutError, match=r"2 requests held at the router"):
        run_router(b, ClusterConfig(2), BareHolder(), np.random.default_rng(0), 0.02)


def test_progress_resets_the_watch(monkeypatch):
    # late_binding holds requests many steps at a time near capacity: with a bound of 50 steps
    # it never goes 50 steps without a route, a rejection or a finish, so nothing is raised.
    monkeypatch.setattr(watchdog, "STALL_STEPS", 50)
    env = LLMClusterEnv(num_requests=200, arrival_rate_rps=52.0)
    res = rollout_router(env, make_router("late_binding", period_s=0.5), 0)
    assert res.metrics["completed"] + res.metrics["rejected"] == 200


def test_finishes_count_as_progress():
    # A cluster-shaped stand-in: requests wait at the router, none is routed; one finishes.
    class C:
        t, queue, n_routed, n_rejected, n_finished = 0.0, [0], 1, 0, 0
        engines, table = [], type("T", (), {"arrival_s": [0.0], "n": 1})()

    c = C()
    w = Watchdog(c, "x", stall_s=1.0, stall_steps=10**9)
    w.check()                       # t = 0: the watch starts
    c.t, c.n_finished = 2.0, 1
    w.check()                       # past the bound, but a request finished meanwhile
    c.t = 2.9
    w.check()                       # 0.9 s since that was seen
    c.t = 3.1
    with pytest.raises(StalledRolloutError, match="^x made no progress .* for 1.1 s"):
        w.check()
    c.queue = []
    w.check()                       # nothing held: nothing stuck
