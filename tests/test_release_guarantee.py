"""The release guarantee (``routers/release.py``): no holding router keeps a request without bound.

Hand-worked cases on the golden latency model of ``test_routers.py`` (prefill of P tokens
1 + P/8 s, a decode iteration of B sequences 1 + B/4 s, block size 4, no watermark) with a
router that never releases anything by itself, then the options that hung the entry points
(issue 31, class 1), then random options inside every holding router's documented ranges and
``policy_search``'s bounds on small episodes, on the default and the KV-limited presets.
"""

from __future__ import annotations

import math
import time

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llm_lb_gym  # noqa: F401
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.agents.policy_search import BOUNDS
from llm_lb_gym.limits import MIN_DECISION_INTERVAL_S
from llm_lb_gym.routers import make_router, run_router
from llm_lb_gym.routers.base import RouterBase
from llm_lb_gym.routers.late_binding import LateBinding
from llm_lb_gym.routers.release import IDLE_HOLD_S, MAX_HOLD_S
from llm_lb_gym.routers.scored_binding import ORDER_WEIGHTS, ScoredBinding
from llm_lb_gym.rollout import make_env_router, rollout_router
from llm_lb_gym.sim.request import Status
from test_routers import batch, cfg

KV_LIMITED = {"engine": {"preset": "llama2-7b-v100-16gb", "max_model_len": 1024}}
"""``conf/experiment/paper_v100_kv_limited.yaml``'s cluster: ~4 requests' worth of KV per instance."""


class NeverReleases(RouterBase):
    """Holds every request (what ``room_margin=1.0`` or ``period_s=1e9`` amounted to)."""

    name = "never_releases"
    defers = True

    def select(self, cluster, rid):
        return None


def test_idle_cluster_releases_after_idle_hold_by_hand():
    # Two requests at 0 and one at 100 s, decisions every 1 s. Nothing runs, so the first grid
    # point with a wait above IDLE_HOLD_S = 60 s (t = 61) releases both (instance 0: fewest
    # requests, ties to the lowest index; then instance 1, as instance 0 has one waiting).
    # They finish by t = 61 + 2 + 4 * 1.25 = 68; the third is alone again and goes at 161.
    assert IDLE_HOLD_S == 60.0
    c = run_router(batch([(0.0, 8, 4), (0.0, 8, 4), (100.0, 8, 4)]), cfg(2), NeverReleases(),
                   np.random.default_rng(0), 1.0)
    assert list(c.table.routed_s) == [61.0, 61.0, 161.0]
    assert list(c.table.instance) == [0, 1, 0]
    assert c.done and c.n_rejected == 0


def test_busy_cluster_releases_at_the_hard_cap_by_hand():
    # A (4 + 4000 tokens) goes at 61 (idle rule) and decodes for ~5000 s; B arrives at 62 and
    # waits while A runs, until the first grid point more than MAX_HOLD_S = 3600 s after its
    # arrival (3663), then goes to instance 1 (instance 0 has A).
    assert MAX_HOLD_S == 3600.0
    c = run_router(batch([(0.0, 4, 4000), (62.0, 8, 4)]), cfg(2, num_kv_blocks=2000), NeverReleases(),
                   np.random.default_rng(0), 1.0)
    assert list(c.table.routed_s) == [61.0, 3663.0]
    assert list(c.table.instance) == [0, 1]
    assert c.done


def test_only_holding_routers_are_wrapped_and_subclasses_stay_wrapped():
    class RoutesAlways(RouterBase):
        name = "routes_always"

        def select(self, cluster, rid):
            return 0

    class HoldingChild(RoutesAlways):
        defers = True

    assert not getattr(RoutesAlways.select, "release_bounded", False)
    assert HoldingChild.select.release_bounded and NeverReleases.select.release_bounded
    # scored_binding defines its own select_from_queue (its max_hold_s): wrapped too; the
    # select it inherits from late_binding is late_binding's wrapped one (not wrapped twice).
    assert ScoredBinding.select_from_queue.release_bounded
    assert ScoredBinding.select is LateBinding.select
    for name in ("late_binding", "scored_binding", "max_capacity", "lookahead"):
        cls = type(make_router(name, see_future=True) if name == "lookahead" else make_router(name))
        assert cls.select.release_bounded
        assert getattr(cls, "select_from_queue", cls.select).release_bounded


def _accounted(env, res) -> None:
    """Every request finished or rejected with a reason; none held past the hard cap."""
    m, tb = res.metrics, env.unwrapped.cluster.table
    assert m["completed"] + m["rejected"] == tb.n and m["unfinished"] == 0
    status = np.asarray(tb.status)
    assert all(tb.reject_reason[i] for i in np.flatnonzero(status == Status.REJECTED))
    routed = np.asarray(tb.routed_s, float)[status == Status.FINISHED]
    wait = routed - np.asarray(tb.arrival_s, float)[status == Status.FINISHED]
    assert wait.max() <= MAX_HOLD_S + env.unwrapped.cfg.decision_interval_s


@pytest.mark.parametrize("name, options, env_kw", [
    ("late_binding", {"period_s": 1e9}, {}),
    ("late_binding", {"period_s": 1e9, "rounds": "global"}, {}),
    ("late_binding", {"period_s": 1e9, "rounds": "per_instance"}, {}),
    ("scored_binding", {"room_margin": 1.0}, {}),
    ("scored_binding", {"room_margin": 0.5}, KV_LIMITED),      # the edge of policy_search's bounds
    ("max_capacity", {"period_s": 1e9}, {}),
])
def test_options_that_hung_release_every_request(name, options, env_kw):
    env = gym.make("LLMCluster-v0", num_requests=60, **env_kw)
    res = rollout_router(env, make_env_router(name, env.unwrapped, **options), 0)
    _accounted(env, res)


def test_lookahead_over_a_base_that_never_releases_ends():
    # The drain of each rollout waits for the base to release what is queued: it used to spin.
    env = gym.make("LLMCluster-v0", num_requests=12)
    router = make_env_router("lookahead", env.unwrapped, plan_horizon_s=1.0,
                             base="scored_binding", base_options={"room_margin": 1.0})
    _accounted(env, rollout_router(env, router, 0))


def test_period_below_the_finest_grid_is_an_error():
    for name in ("late_binding", "max_capacity", "scored_binding"):
        with pytest.raises(ConfigError, match=r"period_s=5e-324 is out of range; allowed: .*0\.0001"):
            make_router(name, period_s=5e-324)
    with pytest.raises(ConfigError, match=r"max_capacity.period_s=0.0 is out of range"):
        make_router("max_capacity", period_s=0.0)
    make_router("late_binding", period_s=0.0)


# --------------------------------------------------------------------------- random options
def _period(hi: float):
    return st.one_of(st.just(0.0), st.floats(MIN_DECISION_INTERVAL_S, hi), st.just(hi))


def _wait():
    return st.one_of(st.none(), st.floats(1e-3, 1e9))


LATE_BINDING = st.fixed_dictionaries({
    "period_s": _period(1e9), "order": st.sampled_from(["shortest", "oldest"]),
    "reserve": st.sampled_from(["full", "prompt"]), "max_wait_s": _wait(),
    "rounds": st.sampled_from(["global", "since_release", "per_instance"]),
})


def _scored(bounds: dict):
    def f(name, lo, hi):
        lo, hi = bounds.get(name, (lo, hi))
        return st.one_of(st.floats(lo, hi), st.sampled_from([lo, hi]))

    return st.fixed_dictionaries({
        "period_s": _period(bounds.get("period_s", (0.0, 10.0))[1]),
        "rounds": st.sampled_from(["global", "since_release", "per_instance"]),
        "max_wait_s": _wait(),
        "reserve_frac": f("reserve_frac", 0.0, 1.0),
        **{k: f(k, lo, hi) for k, (lo, hi) in ORDER_WEIGHTS.items()},
        "room_margin": f("room_margin", -1.0, 1.0),
        "growth_frac": f("growth_frac", 0.0, 1.0),
        "seq_cap_frac": f("seq_cap_frac", 1e-3, 1.0),
        "work_weight": f("work_weight", 0.0, 100.0),
    })


ROUTER_OPTIONS = st.one_of(
    st.tuples(st.just("late_binding"), LATE_BINDING),
    st.tuples(st.just("scored_binding"), _scored({})),           # the options' own ranges
    st.tuples(st.just("scored_binding"), _scored(BOUNDS)),       # policy_search's bounds
    st.tuples(st.just("max_capacity"), st.fixed_dictionaries({"period_s": _period(1e9).filter(bool)})),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(choice=ROUTER_OPTIONS, kv_limited=st.booleans(), seed=st.integers(0, 2**16))
def test_random_options_in_range_release_every_request(choice, kv_limited, seed):
    name, options = choice
    env = gym.make("LLMCluster-v0", num_requests=30, **(KV_LIMITED if kv_limited else {}))
    start = time.process_time()
    res = rollout_router(env, make_env_router(name, env.unwrapped, **options), seed)
    _accounted(env, res)
    assert time.process_time() - start < 20.0
    assert not math.isnan(res.metrics["mean_e2e_s"])
