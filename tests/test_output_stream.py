"""The streamed tokens' output work (sim/output_stream.py): the closed forms of a run of decode
iterations against summing its iterations one by one, in the plain module and its compiled copy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llm_lb_gym.sim import output_stream


def _implementations():
    out = [output_stream.OutputStream]
    try:
        from llm_lb_gym.sim import _output_stream_c   # built by setup.py with the engine
    except ImportError:
        return out
    return out + [_output_stream_c.OutputStream]


@pytest.fixture(params=_implementations(), ids=lambda c: c.__module__.rsplit(".", 1)[-1])
def OutputStream(request):
    return request.param


def _iterations(t0, a, c, j0, j1):
    return [(t0 + j * a + c * j * (j - 1) / 2, a + c * j) for j in range(j0, j1)]


def _free_by_hand(its, wn, x, y):
    """Free CPU seconds in [x, y]: each iteration leaves max(0, 1 - wn / tau) of its time."""
    out = y - x
    for s, tau in its:
        lo, hi = max(x, s), min(y, s + tau)
        if hi > lo:
            out -= (hi - lo) * min(1.0, wn / tau)
    return out


@pytest.mark.parametrize("a,c,w,n", [
    (0.010, 0.0, 2e-4, 8),       # a flat run, 16% of the CPU
    (0.004, 2e-4, 1e-3, 6),      # growing iterations that start beyond the CPU (a backlog) and leave it
    (0.003, 0.0, 1e-3, 5),       # always beyond the CPU: nothing free
    (0.007, 1e-5, 3.8e-6, 64),   # the fitted per-token cost at 64 streams: ~3.5%
])
def test_free_time_and_its_inverse_match_the_iterations_summed(OutputStream, a, c, w, n):
    st = OutputStream(w)
    t0, j0, j1 = 1.0, 3, 40
    backlog = st.add(t0, a, c, j0, j1, n)
    its = _iterations(t0, a, c, j0, j1)
    wn = w * n
    want = [(s + tau, wn - tau) for s, tau in its if wn > tau]
    assert len(backlog) == len(want)
    assert np.allclose(np.array(backlog, dtype=float).reshape(-1, 2), np.array(want, dtype=float).reshape(-1, 2),
                       rtol=1e-12, atol=1e-15)
    S, E = its[0][0], its[-1][0] + its[-1][1]
    rng = np.random.default_rng(0)
    for _ in range(200):
        x, y = sorted(rng.uniform(S - 0.05, E + 0.05, 2))
        assert st.free(x, y) == pytest.approx(_free_by_hand(its, wn, x, y), abs=1e-12)
        amount = rng.uniform(0.0, 0.2)
        t = st.when(x, amount)
        assert t >= x
        got = _free_by_hand(its, wn, x, t)
        if _free_by_hand(its, wn, x, E + 1.0) - 1.0 >= amount - 1e-12:   # reachable
            assert got == pytest.approx(amount, abs=1e-10)
            if t > x + 1e-9:   # the first such time: a moment earlier is short of it
                assert _free_by_hand(its, wn, x, t - 1e-9) < amount + 1e-12


def test_runs_must_come_in_time_order_and_old_ones_are_forgotten(OutputStream):
    st = OutputStream(1e-4)
    st.add(0.0, 0.01, 0.0, 0, 3, 4)
    with pytest.raises(AssertionError, match="reported before"):
        st.add(0.0, 0.01, 0.0, 1, 2, 4)
    st.add(0.03, 0.01, 0.0, 0, 1, 4)
    st.prune(0.035)
    assert len(st.runs) == 1
    assert st.free(0.05, 0.06) == pytest.approx(0.01) and st.when(0.05, 0.002) == pytest.approx(0.052)
    assert math.isclose(st.free(0.03, 0.04), 0.01 * (1 - 4e-4 / 0.01))
