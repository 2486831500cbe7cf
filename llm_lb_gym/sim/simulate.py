"""Run a whole episode on the simulator alone, routing each request the moment it arrives.

This is the simulator's own driver (benchmarks, calibration checks, tests); the Gymnasium env
drives the same ``Cluster`` with a decision interval instead.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import numpy as np

from .clock import run_on_arrival
from .cluster import Cluster
from .config import ClusterConfig
from .request import RequestTable

class RequestBatch(Protocol):
    """What the driver reads of a batch of requests: ``llm_lb_gym.workload.batch.RequestBatch``
    has these columns. A protocol, not that class, so the simulator does not import the
    workload package above it (imports point down: sim <- workload)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    decode_tokens: np.ndarray
    task_id: np.ndarray
    prefix_hashes: Sequence | None
    hash_block_tokens: int


RouteFn = Callable[[Cluster, int], int]
"""(cluster, request id at the head of the router queue) -> instance index."""


def round_robin_route() -> RouteFn:
    state = {"i": -1}

    def route(cluster: Cluster, rid: int) -> int:
        state["i"] = (state["i"] + 1) % len(cluster.engines)
        return state["i"]

    return route


def simulate(batch: RequestBatch, cfg: ClusterConfig, route: RouteFn | None = None, *,
             table: RequestTable | None = None, check: bool = False) -> Cluster:
    """Route every request at its arrival time with ``route`` (round robin by default) and run
    the cluster until every request has finished or been rejected."""
    route = route or round_robin_route()
    table = table or RequestTable.from_batch(batch)
    cluster = Cluster(cfg, table, check=check)

    def route_all(c: Cluster) -> None:
        while c.queue:
            c.route(route(c, c.queue[0]))

    run_on_arrival(cluster, route_all)
    assert cluster.done, "simulation ended with requests neither finished nor rejected"
    for fe in table.frontends:   # the client-side times of the last responses (sim/frontend.py)
        fe.flush()
    return cluster
