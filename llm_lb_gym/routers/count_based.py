"""Routers that ignore request sizes: they see instances, or counts of requests, only.

These are what a load balancer does when it knows nothing about LLM requests: round robin (the
paper's reference point), uniform random, least outstanding requests (Envoy's
``LEAST_REQUEST``, NGINX's ``least_conn``) and its sampled form, the power of two choices
(Mitzenmacher 2001), which gets most of the benefit of least-requests from two probes.

Mixed clusters: round robin and random stay load-agnostic by design (they are the reference
points). Least-requests and power-of-two compare (requests + 1) x the instance's seconds per
token (``sim/speed.py``): the new request's place in line, in the instance's own time, as
weighted least-request balancers do with per-host weights.
"""

from __future__ import annotations

import numpy as np

from .base import RouterBase, argmin


class RoundRobin(RouterBase):
    """Instances in turn, 0, 1, ..., m-1, 0, ... whatever their state (the paper's baseline)."""

    name = "round_robin"

    def reset(self, rng: np.random.Generator, num_instances: int) -> None:
        super().reset(rng, num_instances)
        self._next = 0

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        i = self._next
        self._next = (i + 1) % self.num_instances
        return i


class Random(RouterBase):
    """A uniformly random instance, drawn from the episode's generator."""

    name = "random"

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        return int(self.rng.integers(self.num_instances))


class LeastRequests(RouterBase):
    """The instance holding the fewest requests (waiting + prefilling + running)."""

    name = "least_requests"

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        if cluster.speeds.homogeneous:
            return argmin(e.num_requests for e in cluster.engines)
        tok = cluster.speeds.token_s
        return argmin((e.num_requests + 1) * tok[i] for i, e in enumerate(cluster.engines))


class PowerOfTwo(RouterBase):
    """Probe two distinct random instances, keep the one with fewer requests (tie: lower index).

    With one instance there is nothing to sample and it always gets the request; the generator is
    then not drawn from, so a one-instance episode consumes no randomness.
    """

    name = "power_of_two"

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        m = self.num_instances
        if m == 1:
            return 0
        a, b = (int(x) for x in self.rng.choice(m, size=2, replace=False))
        if a > b:
            a, b = b, a
        eng = cluster.engines
        if cluster.speeds.homogeneous:
            return b if eng[b].num_requests < eng[a].num_requests else a
        tok = cluster.speeds.token_s
        return b if (eng[b].num_requests + 1) * tok[b] < (eng[a].num_requests + 1) * tok[a] else a
