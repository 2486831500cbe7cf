"""Batching policies of an instance's waiting queue, defined once for every implementation.

A policy says in which order never-run waiting requests are tried for admission and whether
admission skips a request that does not fit (and keeps trying the ones behind it) or stops at
it (head-of-line blocking, as vLLM v0). Preempted requests always come first, in preemption
order, under every policy (``docs/simulator_semantics.md``).

Why one module: the fast engine (``engine.py``), the step-by-step reference (``reference.py``)
and the config validation all read these definitions, so a policy cannot mean one thing in one
place and another elsewhere. The sort key is a function of the request's prompt tokens ``p``,
tokens generated so far ``o`` and predicted decode tokens ``pred``; ties keep queue order
(Python's sort is stable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .._validate import lookup


def _least_work_left(p: int, o: int, pred: float) -> float:
    """Fewest predicted decode tokens left first."""
    return pred - o


def _largest_first(p: int, o: int, pred: float) -> float:
    """Longest prefill (p + o) first: packs the KV cache with the biggest request that fits."""
    return -(p + o)


@dataclass(frozen=True)
class BatchingPolicy:
    """Admission order and skip rule of one scheduler."""

    name: str
    key: Optional[Callable[[int, int, float], float]]
    """Sort key of never-run waiting requests, f(p, o, pred); None keeps queue (route) order."""
    skip_unfit: bool
    """True: a request that does not fit is skipped and smaller ones behind it are tried;
    False: admission stops at the first request that does not fit."""
    doc: str


POLICIES: dict[str, BatchingPolicy] = {p.name: p for p in (
    BatchingPolicy("fcfs", None, False,
                   "route order; stop at the first request that does not fit (vLLM v0)"),
    BatchingPolicy("least_work_left", _least_work_left, False,
                   "fewest predicted decode tokens left (pred - o) first; stop at the first misfit"),
    BatchingPolicy("bin_packing", _largest_first, True,
                   "largest p + o first; skip requests that do not fit and try smaller ones"),
)}

SCHEDULERS: tuple[str, ...] = tuple(POLICIES)
"""Valid ``engine.scheduler`` names."""


def get_policy(name: str) -> BatchingPolicy:
    """Policy by name; the error lists the valid names."""
    return lookup("engine.scheduler", POLICIES, name)
