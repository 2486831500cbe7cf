"""The reward's in-system penalty integrated over the decision grid, across the instances.

The env's reward (``envs/reward.py``) charges, at every point ``j dt`` of the decision grid,
the in-system penalty ``sum_j inv_ideal_j (1 - min(o_j / pred_j, 1))`` of every request on an
instance (or, with ``count_mode``, the number of requests: total latency's integrand), and
credits the requests that finished in the interval before it, each point weighted
``w * g**(j - k0 - 1)`` (a learner's per-interval discount; ``w = g = 1``: plain sums, bit for
bit). These functions compute those sums for the cluster's ``tick`` and ``run_grid`` (the
decision clock's fast-forward), one instance at a time: advance it to each grid point and read
its penalty (``Engine.advance_to``, ``Engine.penalty``; inside a planned decode stretch, the
stretch's closed form and the penalty sums directly, see ``grid_penalty``).

Why this much and no more is on the reward's side. The penalty at a point is O(1) only through
sums updated at each change of an instance's request set (a request enters or leaves the prompt
phase, joins or leaves the running batch, reaches its predicted length). Those changes happen
inside ``advance_to``, out of the env's sight, so the engine must report each one: the sums
live in ``progress.py``, which the engine calls as C (a Python callback per state change into
``envs/`` would cost more than the sums, and the sim layer may not import the env's). The
walk over the grid points is this module's, still in the sim layer (the env reads its sums
through ``Cluster.run_grid`` / ``tick``), and compiled (``penalty.pxd``; the cluster takes these
functions from the module of its engine's implementation, ``_compiled.module_like``) because it
runs at every env step, for every instance and grid point. Measured on the default env's
round-robin step (alternating episodes, one process, compiled engine, 30 per variant, package
0.5.0): this walk as plain Python over the compiled engine made the step 22% slower (0.78x);
compiled but calling ``advance_to`` and ``penalty`` at every point and returning a tuple per
instance, 3% slower (0.97x). With the decode-stretch path in ``grid_penalty`` (it reads the
engine's stretch plan and the progress sums directly: the same numbers as those calls, bit for
bit) and ``Completions`` instead of the tuple, the split engine's step measured 1.02x of the
unsplit one (the two changes were not measured apart).
"""

from __future__ import annotations

import math

INF = math.inf


class Completions:
    """One instance's completions during a grid walk, each weighted by the point after it:
    all of them (``fin_w``) and those within their SLO deadlines (``met_w``). An object the
    caller reuses, not a returned tuple of three boxed floats per instance (see the module
    docstring for what was measured)."""

    def __init__(self):
        self.fin_w = 0.0
        self.met_w = 0.0


def grid_penalty(e, k0: int, dt: float, k1: int, w: float, g: float, out: Completions) -> float:
    """Instance ``e`` over the grid points (k0+1)dt .. k1 dt: the weighted sum of its penalty at
    the points (returned) and of its completions (in ``out``). A point after which the
    instance is idle ends the walk (the penalty is 0 at every later point)."""
    total = fin_w = met_w = 0.0
    j = k0 + 1
    while j <= k1 and not e.idle():
        if e.in_decode_stretch():
            # Nothing finishes or starts before the stretch's last iteration: step the clock
            # in closed form (the numbers ``advance_to`` computes) and, until a request reaches
            # its prediction, the penalty linearly in G, inline (3% of an env step, measured).
            t0, a, c, G0, t_last = e._st_t0, e._st_a, e._st_c, e._st_G0, e._st_t_last
            k = e.G - G0
            t = e.t
            value = e.penalty()   # pops saturations due at the current G
            pg = e.progress
            h = pg.sat_heap
            sat_next = h[0][0] if h else INF
            p0, A1, A2, A3 = pg.pen_static, pg.pA1, pg.pA2, pg.pA3
            if e.count_mode:   # membership is fixed inside a stretch: a constant count
                p0, A1, A2, A3, sat_next = value, 0.0, 0.0, 0.0, INF
            while j <= k1:
                T = j * dt
                if T > t_last:
                    break
                if t < T:
                    k += 1
                    t = t0 + k * a + c * k * (k - 1) / 2
                    while t < T:
                        k += 1
                        t = t0 + k * a + c * k * (k - 1) / 2
                    G = G0 + k
                    e.jump_in_stretch(G, t)
                    if G < sat_next:   # no prediction reached: the running sum is linear in G
                        run = A1 - A2 - G * A3
                        value = p0 + (run if run > 0.0 else 0.0)
                    else:
                        value = e.penalty()
                        sat_next = h[0][0] if h else INF
                        A1, A2, A3 = pg.pA1, pg.pA2, pg.pA3
                total += w * value
                w *= g
                j += 1
            if j > k1:
                break
        T = j * dt
        if e.t < T:
            nf, nm = e.n_finished, e.n_slo_met
            e.advance_to(T)
            if e.n_finished != nf:
                fin_w += w * (e.n_finished - nf)
                met_w += w * (e.n_slo_met - nm)
        total += w * e.penalty()
        w *= g
        j += 1
    out.fin_w = fin_w
    out.met_w = met_w
    return total


def grid_penalties(engines: list, k0: int, dt: float, k1: int, w: float = 1.0,
                   g: float = 1.0) -> tuple:
    """``Cluster.run_grid``'s pass over its instances up to grid point ``k1``: (penalty sum,
    requests finished, the same weighted, weighted within their SLO) (``grid_penalty``)."""
    total = 0.0
    fin = 0
    fin_w = 0.0
    met_w = 0.0
    out = Completions()
    for e in engines:
        fin -= e.n_finished
        total += grid_penalty(e, k0, dt, k1, w, g, out)
        fin += e.n_finished
        fin_w += out.fin_w
        met_w += out.met_w
    return total, fin, fin_w, met_w


def grid_penalties_until_idle(engines: list, k0: int, dt: float, w: float = 1.0,
                              g: float = 1.0) -> tuple:
    """``Cluster.run_grid`` after the last arrival: each instance from grid point k0+1 on until
    it is idle after a point. Returns (penalty sum, requests finished, the same weighted,
    weighted within their SLO, index of the last point any instance needed (k0 if none))."""
    total = 0.0
    fin = 0
    fin_w = 0.0
    met_w = 0.0
    k_end = k0
    for e in engines:
        fin -= e.n_finished
        pen = fw = mw = 0.0
        wj = w   # the weight of point j
        j = k0
        while not e.idle():
            j += 1
            T = j * dt
            if e.t < T:
                nf, nm = e.n_finished, e.n_slo_met
                e.advance_to(T)
                if e.n_finished != nf:
                    fw += wj * (e.n_finished - nf)
                    mw += wj * (e.n_slo_met - nm)
            pen += wj * e.penalty()
            wj *= g
        total += pen
        fin += e.n_finished
        fin_w += fw
        met_w += mw
        if j > k_end:
            k_end = j
    return total, fin, fin_w, met_w, k_end


def tick_penalties(engines: list, T: float) -> tuple:
    """``Cluster.tick``'s pass over its instances: advance each to ``T``, then (sum of their
    in-system penalties, requests they finished so far)."""
    pen = 0.0
    fin = 0
    for e in engines:
        if e.t < T:
            e.advance_to(T)
        pen += e.penalty()
        fin += e.n_finished
    return pen, fin
