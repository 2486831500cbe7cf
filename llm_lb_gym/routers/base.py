"""The interface every heuristic router implements, and the pieces they share.

A router only *decides*: given the cluster (read-only by convention) and the request at the head
of the router queue, it names an instance or defers. Whoever drives the simulation (the
Gymnasium env, ``drive.run_router``, an evaluation script) performs the route. Keeping routers
free of side effects on the cluster lets the same object serve as a baseline in the env, as the
policy of the env-free driver, and as a reference inside tests.

What a router may read (see ``sim/cluster.py`` and ``sim/engine.py``): ``cluster.t``,
``cluster.queue``, ``cluster.last_route_s``, ``cluster.engines`` and their load aggregates, and from ``cluster.table``
``prompt``, ``pred``, ``decode_bucket``, ``prompt_bucket``, ``task_id``, ``arrival_s``, and the
prompt's block hashes ``hashes`` / ``hash_block_tokens`` (a gateway computes them from the prompt),
SLO deadlines ``ttft_deadline_s``, ``tbt_deadline_s`` (``slo_on``). Never the true ``decode``: a
router sees predictions only.

Two calling conventions:

- ``select(cluster, rid)``: every router. ``rid`` is the router-queue head; return an instance
  index, or ``None`` to leave the head waiting one decision interval.
- ``select_from_queue(cluster)``: optional, for routers that reorder the queue (Min-Min). Return
  ``(queue position, instance)`` or ``None``. A driver calls it *instead of* ``select`` when the
  router has it, and routes with ``cluster.route(instance, position)``; ``drive.decide`` does
  exactly this, so drivers should go through it.

Mixed clusters (instances of different speed or size): routers that balance load compare
instances in seconds, not tokens or counts, through ``cluster.speeds`` (``sim/speed.py``, the
one definition of an instance's speed and a request's estimated service time there); see
``load_s``. In a homogeneous cluster they keep their token or count rules exactly.

Holding (``defers = True``): such a router's ``select`` / ``select_from_queue`` are wrapped at
class creation so that no request is held without bound whatever the options say
(``release.py``: an hour at most, a minute while no instance runs anything).

Ties always break to the lowest instance index, so every router except ``random`` and
``power_of_two`` is a deterministic function of the cluster state, and those two draw only from
the generator handed to ``reset``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Protocol, runtime_checkable

import numpy as np

from .release import bound_holds


@runtime_checkable
class Router(Protocol):
    """What the env and the drivers need from a router."""

    name: str
    defers: bool
    """Whether ``select`` may return ``None``. Drivers that route on arrival (no decision
    interval) cannot honour a deferral, so they refuse such routers up front."""

    def reset(self, rng: np.random.Generator, num_instances: int) -> None:
        """Start an episode: forget per-episode state, keep ``rng`` as the only randomness."""
        ...

    def select(self, cluster, rid: int) -> int | None:
        """Instance for request rid (the router-queue head), or None to defer it one decision interval."""
        ...


@runtime_checkable
class QueueRouter(Router, Protocol):
    """A router that may pick any queued request, not only the head."""

    def select_from_queue(self, cluster) -> tuple[int, int] | None:
        """(position in ``cluster.queue``, instance) to route now, or None to defer."""
        ...


@dataclass(frozen=True)
class NoOptions:
    """Options of a router that has none (the registry still rejects unknown keywords)."""


class RouterBase:
    """Shared plumbing: the options object, the episode's generator and instance count."""

    name: ClassVar[str] = ""
    defers: ClassVar[bool] = False
    Options: ClassVar[type] = NoOptions

    def __init_subclass__(cls, **kwargs):
        # The release guarantee (routers/release.py): a router that may hold cannot hold a
        # request without bound, whatever its options.
        super().__init_subclass__(**kwargs)
        bound_holds(cls)

    def __init__(self, options: Any = None):
        if options is None:
            options = self.Options()
        if not isinstance(options, self.Options):
            raise TypeError(f"router {self.name!r} takes {self.Options.__name__}, got {type(options).__name__}")
        self.options = options
        self.rng: np.random.Generator | None = None
        self.num_instances = 0

    def reset(self, rng: np.random.Generator, num_instances: int) -> None:
        if num_instances < 1:
            raise ValueError(f"router {self.name!r}: num_instances={num_instances} must be >= 1")
        self.rng = rng
        self.num_instances = num_instances

    def _require_reset(self, cluster) -> None:
        # A router used before reset() (or on a cluster of a different size) would index out of
        # range or keep stale per-episode state; fail loudly instead.
        if self.num_instances != len(cluster.engines):
            raise RuntimeError(
                f"router {self.name!r} was reset for {self.num_instances} instances but the cluster "
                f"has {len(cluster.engines)}; call reset(rng, num_instances) first")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"


def argmin(values: Iterable[float]) -> int:
    """Index of the smallest value; ties go to the lowest index."""
    best_i, best_v = -1, 0.0
    for i, v in enumerate(values):
        if best_i < 0 or v < best_v:
            best_i, best_v = i, v
    if best_i < 0:
        raise ValueError("argmin of an empty sequence")
    return best_i


def argmax(values: Iterable[float]) -> int:
    """Index of the largest value; ties go to the lowest index."""
    return argmin(-v for v in values)


def work_left_tokens(engine) -> float:
    """Prompt tokens still to prefill plus predicted decode tokens still to generate.

    The paper's JSQ measure of an instance's backlog ("fewest prompt + decode tokens yet to be
    processed"); both terms are O(1) aggregates of the engine.
    """
    return engine.pending_prefill_tokens + engine.decode_tokens_left()


def load_s(cluster, i: int, backlog_tokens: float) -> tuple[float, float]:
    """Mixed clusters: the sort key of instance ``i`` for a router that balances a backlog of
    ``backlog_tokens`` tokens: (the backlog in seconds of i's time, i's seconds per token), so
    the least backlog in seconds wins and, on a tie (idle instances), the faster instance.

    Why the request's own service time is not added, as Min-Min's completion time would: under
    continuous batching the new request runs alongside the backlog, so where it finishes first
    is set by how fast each backlog drains, and adding its isolated service time (or its tokens
    at the instance's rate) sends every long request to the fast instances. Measured on
    ``experiment=mixed_a100_v100`` (10 paired episodes, change of mean E2E vs round robin):
    JSQ -32.5% without the term, -21.3% with the isolated service time, -27.9% with its
    tokens; speed-blind token JSQ -27.3% (docs/heterogeneous.md).

    Routers call it only when ``cluster.speeds.homogeneous`` is False: on identical instances
    the token count orders them the same way, and rescaling it could only break ties
    differently by rounding."""
    tok = cluster.speeds.token_s[i]
    return backlog_tokens * tok, tok
