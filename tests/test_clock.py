"""One decision clock: the grid walk lives in ``llm_lb_gym/sim/clock.py`` and nowhere else.

A static scan (``ast``) of llm_lb_gym/, agents/ and experiments/ fails on a second copy:
a loop that both moves a cluster's clock (``advance_to``) and routes (``route`` / ``decide``),
the grid jump's arithmetic (``ceil`` of a time over the interval), a call of the jump helper
or of ``Cluster.run_grid`` outside the clock, a request table built from a batch outside
``RequestTable.from_batch``, or a router seed ``[seed, 7]`` outside ``drive.router_rng``. Then
the clock's operations are checked against a hand-worked grid.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from llm_lb_gym.routers.drive import build_table, router_rng, run_router
from llm_lb_gym.sim.clock import decide_on_grid, drain, grid_index_at_or_after, next_decision_index
from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig
from llm_lb_gym.workload.batch import RequestBatch

ROOT = Path(__file__).resolve().parents[1]
SCANNED = [p for top in ("llm_lb_gym", "agents", "experiments") for p in sorted((ROOT / top).rglob("*.py"))]
CLOCK = ROOT / "llm_lb_gym" / "sim" / "clock.py"


def _calls(node) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            out.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return out


def _findings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    rel = path.relative_to(ROOT).as_posix()
    found = []
    for n in ast.walk(tree):
        where = f"{rel}:{getattr(n, 'lineno', 0)}"
        if isinstance(n, (ast.While, ast.For)):
            calls = _calls(n)
            if "advance_to" in calls and calls & {"route", "decide", "select", "select_from_queue"}:
                found.append(f"{where}: a decision loop (advances the clock and routes)")
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("grid_index_at_or_after", "run_grid"):
                found.append(f"{where}: {name} (the grid jump belongs to the clock)")
            if name == "ceil" and n.args and isinstance(n.args[0], ast.BinOp) \
                    and isinstance(n.args[0].op, ast.Div):
                den = ast.unparse(n.args[0].right)
                if "dt" in den or "interval" in den:
                    found.append(f"{where}: ceil(... / {den}) (grid arithmetic)")
            if name == "RequestTable" and n.args and isinstance(n.args[0], ast.Attribute) \
                    and n.args[0].attr == "arrival_s":
                found.append(f"{where}: RequestTable built from a batch (use RequestTable.from_batch)")
            if name == "default_rng" and n.args and isinstance(n.args[0], ast.List) \
                    and ast.unparse(n.args[0].elts[-1]) == "7":
                found.append(f"{where}: a router seed [.., 7] (use drive.router_rng)")
    return found


ALLOWED = {
    "llm_lb_gym/sim/clock.py",          # the clock itself
    "llm_lb_gym/sim/cluster.py",        # defines run_grid
    "llm_lb_gym/sim/request.py",        # RequestTable.from_batch
    "llm_lb_gym/calibration/replay.py", # a closed-loop client (next request at each response's end), no router
}


def test_the_scan_finds_a_copy():
    """The detector is not blind: the grid loop as it was written before the clock existed."""
    copy = ast.parse(
        "def on_grid(cluster, router, dt):\n"
        "    k = 0\n"
        "    while not cluster.done:\n"
        "        cluster.advance_to(k * dt)\n"
        "        choice = decide(cluster, router)\n"
        "        k = max(k + 1, math.ceil(cluster.next_arrival_s / dt))\n"
        "rng = np.random.default_rng([seed, 7])\n")
    p = ROOT / "tests" / "_copy_for_scan.py"
    try:
        p.write_text(ast.unparse(copy))
        found = _findings(p)
    finally:
        p.unlink()
    assert len(found) == 3, found


def test_one_decision_grid_loop_in_the_code():
    assert len(SCANNED) > 100 and CLOCK in SCANNED
    bad = [f for p in SCANNED if p.relative_to(ROOT).as_posix() not in ALLOWED for f in _findings(p)]
    assert not bad, "a second copy of the decision clock:\n" + "\n".join(bad)


# --------------------------------------------------------------------------- the clock's rules
def _cluster(arrivals, decode=20, m=2):
    n = len(arrivals)
    b = RequestBatch.from_arrays(np.asarray(arrivals, float), np.full(n, 50), np.full(n, decode))
    return Cluster(ClusterConfig(num_instances=m), build_table(b))


def test_jump_to_the_first_grid_point_at_or_after_the_next_arrival():
    c = _cluster([0.0, 0.05, 0.06, 1.0])
    c.advance_to(0.0)
    assert next_decision_index(c, 0, 0.02) == 3            # 0.05 s -> 0.06 s, point 3
    assert grid_index_at_or_after(0.06, 0.02, 1) * 0.02 >= 0.06
    c.advance_to(1.0)
    assert c.all_arrived and math.isinf(c.next_arrival_s)


def test_decide_on_grid_decides_on_grid_points_only():
    """Routed at k * dt: the first grid point at or after each arrival (a route-all router)."""
    dt = 0.02
    arrivals = [0.0, 0.031, 0.031, 0.5, 0.73]
    c = _cluster(arrivals)
    c.advance_to(0.0)
    routed_at = []

    def route_all(cl):
        while cl.queue:
            routed_at.append(cl.t)
            cl.route(len(routed_at) % 2)

    k = decide_on_grid(c, route_all, 0, dt)
    assert c.all_arrived and not c.queue
    want = [grid_index_at_or_after(a, dt, 0) * dt for a in arrivals]
    assert routed_at == want
    assert k == grid_index_at_or_after(0.73, dt, 0) + 1
    drain(c, route_all, k, dt)
    assert c.done


def test_a_hold_waits_one_interval_and_the_window_stops():
    dt = 0.02
    c = _cluster([0.0])
    c.advance_to(0.0)
    asked = []

    def hold_three_times(cl):
        asked.append(cl.t)
        if len(asked) > 3:
            cl.route(0)

    k = decide_on_grid(c, hold_three_times, 0, dt)
    assert asked == [0.0, dt, 2 * dt, 3 * dt] and k == 4
    c2 = _cluster([0.0, 5.0])
    c2.advance_to(0.0)
    k2 = decide_on_grid(c2, lambda cl: None, 0, dt, t_end=0.1)   # holds until the window ends
    assert k2 == 5 and c2.queue and c2.t == pytest.approx(4 * dt)


def test_run_router_on_the_grid_matches_the_env_seeded_router_stream():
    """The router seed is derived in one place and drives the same episode twice."""
    b = RequestBatch.from_arrays(np.arange(30) * 0.013, np.full(30, 80), np.full(30, 40))
    from llm_lb_gym.routers.registry import make_router

    outs = []
    for _ in range(2):
        c = run_router(b, ClusterConfig(num_instances=3), make_router("random"), router_rng(4),
                       decision_interval_s=0.02)
        outs.append(list(c.table.instance))
    assert outs[0] == outs[1]


@pytest.mark.parametrize("name", ["jsq", "min_min", "random"])
def test_router_evaluation_and_the_env_walk_the_same_grid(name):
    """``drive.run_router`` on the grid and the env driven by the same router (same requests,
    predictions and router seed) route every request to the same instance at the same time."""
    from llm_lb_gym.envs import LLMClusterEnv
    from llm_lb_gym.rollout import make_env_router, rollout_router

    env = LLMClusterEnv(num_requests=120, arrival_rate_rps=30.0)
    router = make_env_router(name, env)
    rollout_router(env, router, seed=3)
    tb = env.cluster.table
    c = run_router(env.batch, env.cluster_cfg, router, router_rng(3), decision_interval_s=0.02,
                   pred_decode_tokens=tb.pred, decode_scheme=env.obs_builder.decode_scheme)
    assert c.table.instance == tb.instance
    assert c.table.routed_s == tb.routed_s and c.table.finish_s == tb.finish_s
