"""Returns in simulated time: per-transition discounts, the latency penalty, and the claim that
the discounted return does not depend on how the timeline is cut into steps.

The reference below drives the simulator directly, one decision interval at a time, with the
same router and the env's decision semantics (route while the router agrees, then advance one
interval), and discounts each interval's penalty by its own absolute time. It shares no code
with the env's step accounting (fast-forwards, ``run_grid``, in-step weights), so agreement to
1e-9 holds the env's return to the definition.
"""

from __future__ import annotations

import math

import pytest

from llm_lb_gym.envs import LLMClusterEnv
from llm_lb_gym.routers.drive import decide, router_rng
from llm_lb_gym.rollout import make_env_router, rollout_router
from llm_lb_gym.sim.metrics import request_latencies

SMALL = dict(num_requests=150, arrival_rate_rps=40.0)


def _env_return(env, router_name, seed, **router_options):
    """Discounted return of one episode from the env's rewards and discounts."""
    env.reset(seed=seed)
    router = make_env_router(router_name, env, **router_options)
    router.reset(router_rng(seed), env.m)
    ret, disc, zero_time_discounts = 0.0, 1.0, []
    while True:
        c = env.cluster
        choice = decide(c, router) if c.queue else None
        _, r, term, _, info = env.route_step(env.m) if choice is None else env.route_step(choice[1], choice[0])
        ret += disc * r
        if info["dt_s"] == 0.0:
            zero_time_discounts.append(info["discount"])
        disc *= info["discount"]
        if term:
            return ret, zero_time_discounts


def _reference_return(env, router_name, seed, horizon_s, latency: bool, completion_reward: float,
                      **router_options):
    """The same episode, interval by interval on the bare cluster: sum over grid points j of
    exp(-(j - 1) dt / H) * (-penalty_j * unit + completion_reward * completions_j)."""
    env.reset(seed=seed)   # the same requests and predictions
    c = env.cluster
    router = make_env_router(router_name, env, **router_options)
    router.reset(router_rng(seed), env.m)
    dt = env.cfg.decision_interval_s
    unit = dt if latency else 1.0
    ret, j, finished = 0.0, 0, 0
    while not (c.all_arrived and not c.queue and c.done):
        while c.queue:   # routing takes no simulated time
            choice = decide(c, router)
            if choice is None:
                break
            c.route(choice[1], choice[0])
        j += 1
        pen, fin = c.tick(j * dt)
        w = math.exp(-(j - 1) * dt / horizon_s)
        ret += w * (-pen * unit + completion_reward * (fin - finished))
        finished = fin
    return ret


@pytest.mark.parametrize("router,options", [("round_robin", {}), ("max_capacity", {}),
                                            ("late_binding", {"period_s": 0.5})])
@pytest.mark.parametrize("latency", [True, False])
def test_discounted_return_equals_the_interval_by_interval_definition(router, options, latency):
    horizon = 7.0
    reward = {"mode": "baseline", "horizon_s": horizon, "penalty": "latency" if latency else "paper",
              "completion_reward": 0.0 if latency else 60.0}
    env = LLMClusterEnv(reward=reward, action={"mask_idle_defer": False}, **SMALL)
    got, zero = _env_return(env, router, 3, **options)
    want = _reference_return(env, router, 3, horizon, latency, reward["completion_reward"], **options)
    assert got == pytest.approx(want, rel=1e-9)
    # Routing steps take no simulated time and are not discounted (several share one instant).
    assert zero and all(d == 1.0 for d in zero)


def test_undiscounted_latency_penalty_is_minus_total_latency_on_the_grid():
    """Little's law on the decision grid: every request contributes dt per grid point it spends
    in the system, so the undiscounted penalty is minus the sum of E2E latencies, up to one
    interval per request at each end."""
    env = LLMClusterEnv(reward={"mode": "baseline", "penalty": "latency", "completion_reward": 0.0,
                                "horizon_s": 1e9}, **SMALL)
    res = rollout_router(env, make_env_router("round_robin", env), 5)
    e2e = request_latencies(env.cluster.table)["e2e_s"]
    dt = env.cfg.decision_interval_s
    assert len(e2e) == SMALL["num_requests"]
    assert abs(res.episode_return + e2e.sum()) <= 2 * dt * len(e2e)


def test_per_step_mode_is_the_papers_constant_gamma():
    env = LLMClusterEnv(reward={"mode": "baseline", "discount": "per_step", "gamma": 0.9}, **SMALL)
    env.reset(seed=0)
    for _ in range(50):
        _, _, term, _, info = env.step(int(env.action_masks().nonzero()[0][0]))
        assert info["discount"] == 0.9
        if term:
            break


def test_semi_mdp_discount_is_gamma_s_to_the_step_duration():
    env = LLMClusterEnv(reward={"mode": "baseline", "horizon_s": 20.0}, **SMALL)
    env.reset(seed=0)
    seen = set()
    for i in range(100_000):
        mask = env.action_masks()
        a = env.defer_action if mask[-1] and i % 7 == 3 else int(mask.nonzero()[0][0])
        _, _, term, _, info = env.step(a)
        assert info["discount"] == pytest.approx(math.exp(-info["dt_s"] / 20.0), rel=1e-12)
        seen.add(round(info["dt_s"], 6))
        if term:
            break
    assert term and 0.0 in seen and 0.02 in seen and len(seen) > 2   # routes, defers, longer steps


def test_hurl_form_shrinks_the_discount_while_guidance_lasts():
    reward = {"mode": "workload_guided", "guidance_form": "hurl", "decay": 0.5, "horizon_s": 10.0}
    env = LLMClusterEnv(reward=reward, **SMALL)
    for k, lam in ((0, 0.0), (2, 1 - math.exp(-1.0))):
        env.reset(seed=0, options={"guidance_episode": k})
        _, _, _, _, info = env.step(env.defer_action)
        assert info["discount"] == pytest.approx(lam * math.exp(-info["dt_s"] / 10.0))
    with pytest.raises(Exception, match="guidance_form=hurl needs reward.mode=workload_guided"):
        LLMClusterEnv(reward={"mode": "workload_aware", "guidance_form": "hurl"})
