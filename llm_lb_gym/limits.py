"""Bounds on inputs that keep the simulator exact and every call's work bounded.

``MAX_ARRIVAL_S``: arrival times (seconds from the episode's first request, after any replay
speed-up) must not exceed 1e9 s, about 31.7 years. Far beyond any trace or load test, it keeps
the decision grid exact: with the smallest decision interval (``MIN_DECISION_INTERVAL_S``) grid
indices stay below 1e13, where ``k * dt`` is exact enough that the search for the next
decision time ends in a step or two (at 2**53 / dt seconds it would never end), and the clock
still resolves 1e-7 s. Trace readers, replay windows, arrival processes and ``RequestBatch``
check it and raise a named error (``ArrivalLimitError`` or the readers' ``TraceFormatError``)
that says which file or option produced the time.

``MAX_TOKENS``: token counts (a request's prompt or output length, read from a trace or corpus
or given in a ``RequestBatch``) must not exceed 2**31 - 1. No model's context comes near it,
and below it sums and squares of counts stay exact in int64 (the compiled engine's C longs),
so a garbage value such as ``1e19`` is an error naming its file, line and column instead of
an overflow at ``reset``.
"""

from __future__ import annotations

import numpy as np

from ._validate import ConfigError, check_range

MAX_ARRIVAL_S = 1e9
"""Latest allowed arrival time in seconds from the episode start (about 31.7 years)."""

MAX_TOKENS = 2**31 - 1
"""Largest allowed token count of one request's prompt or output."""

MAX_CONTEXT_TOKENS = 2**20
"""Largest engine context (``max_model_len``) and iteration token budget
(``max_num_batched_tokens``): 1,048,576 tokens, beyond any served model. Longer requests are
rejected at arrival, so this bounds the simulated time (and the decision-grid walk) of one
request: a 1M-token prefill on the V100 preset lasts about 6 hours, a 2**31-token one years."""

MAX_REQUESTS = 10_000_000
"""Most requests per episode (the simulator keeps a few Python lists of this length)."""

MAX_INSTANCES = 1024
"""Most instances in a cluster (the observation has a row per instance)."""

MIN_DECISION_INTERVAL_S = 1e-4
"""Shortest allowed decision interval (0.1 ms, below any iteration time of the presets); the
longest is ``MAX_ARRIVAL_S``."""

MIN_RATE_RPS = 1.0 / MAX_ARRIVAL_S
"""Slowest allowed arrival rate and replay ``rate_scale``: below it even one mean gap (or one
recorded second) lies past ``MAX_ARRIVAL_S``."""

CV_RANGE = (0.01, 100.0)
"""Allowed coefficient of variation of gamma inter-arrival times (gamma shape 1e4 .. 1e-4)."""

_MAX_GRID_INDEX = 2**52
"""Grid indices at or above this lose exactness in ``k * dt`` (float64 has 53 bits); the
decision clock (``sim/clock.py``) refuses them."""


def check_period_s(name: str, value: float, hi: float = MAX_ARRIVAL_S, zero: bool = True) -> None:
    """A holding router's round period: 0 (with ``zero``: no rounds) or within
    [``MIN_DECISION_INTERVAL_S``, ``hi``]. A shorter positive period makes ``t / period``
    overflow to inf (the round index is its floor), and no grid is finer than that interval."""
    check_range(name, value, 0.0, hi)
    if (value == 0.0 and not zero) or 0.0 < value < MIN_DECISION_INTERVAL_S:
        raise ConfigError(f"{name}={value!r} is out of range; allowed: {'0 or ' if zero else ''}"
                          f"[{MIN_DECISION_INTERVAL_S}, {hi:g}]")


class ArrivalLimitError(ConfigError):
    """An arrival time lies beyond ``MAX_ARRIVAL_S``, or beyond what the decision grid resolves."""


def check_arrival_span(times_s, source: str, hint: str = "") -> None:
    """Raise ArrivalLimitError naming ``source`` if the last of the non-decreasing ``times_s``
    exceeds ``MAX_ARRIVAL_S``. ``hint`` says which option to change."""
    if len(times_s) == 0:
        return
    last = float(np.max(times_s))
    if last != last:
        raise ArrivalLimitError(f"{source}: arrival times include NaN; allowed: finite seconds")
    if not last <= MAX_ARRIVAL_S:
        raise ArrivalLimitError(
            f"{source}: arrival times reach {last:.6g} s, beyond the limit MAX_ARRIVAL_S="
            f"{MAX_ARRIVAL_S:g} s (llm_lb_gym.limits){'; ' + hint if hint else ''}")


MAX_TRAINING_EPISODE = 2**53
"""Largest training-episode counter (``set_training_episode``, ``reset(options=
{"guidance_episode": k})``): float64 holds every whole number up to it, so the guidance weight's
``exp(-decay * k)`` is computed from the exact count."""
