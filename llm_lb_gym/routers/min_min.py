"""Min-Min: the shortest queued job to the instance that frees up first.

Min-Min (Ibarra and Kim 1977; Braun et al. 2001) schedules independent jobs on machines: among
all (job, machine) pairs pick the one with the smallest completion time = machine ready time +
job time, assign it, repeat. The paper's version (App. A.2) sizes a job as its prompt tokens plus
the *upper bound* of its predicted decode bucket - a conservative size from a classifier that
only knows the bucket - and notes that with identical instances it becomes shortest-job-first.
That is what is built here: on identical instances the minimum over pairs separates into the
shortest job (ties: earliest in the queue) and the earliest-ready instance (ties: lowest index).

Units: job time and ready time are both in tokens of work, the same measure JSQ uses for an
instance's backlog (prompt tokens still to prefill + predicted decode tokens still to generate),
so "earliest expected availability" is the smallest backlog.

Bucket upper bounds come from ``decode_edges_tokens``, which must be the interior edges of the
scheme that filled ``table.decode_bucket`` (the env's decode bucket scheme: pass
``scheme.edges_tokens``). A request in the open-ended last bucket, or any request when no edges
are given (one open bucket, the table's default), is sized by its predicted tokens.

Mixed clusters (instances of different speed): ready time = the backlog in seconds of each
instance's own time (``base.load_s``; ties to the faster instance), and the job is still the
shortest in tokens. The job's own time on each instance is left out of the pair's completion
time on purpose: under continuous batching it runs alongside the backlog, and adding it (its
bucket upper bound through the instance's latency model) sent long jobs to the fast instances
and cost 14-18 points of gain vs round robin (``base.load_s``, docs/heterogeneous.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validate import ConfigError
from .base import RouterBase, argmin, load_s, work_left_tokens


@dataclass(frozen=True)
class MinMinOptions:
    decode_edges_tokens: tuple[int, ...] = ()
    """Interior edges of the decode bucket scheme behind ``table.decode_bucket``; empty = size
    jobs by predicted tokens."""

    def __post_init__(self) -> None:
        edges = tuple(self.decode_edges_tokens)
        try:
            edges = tuple(int(e) for e in edges)
        except (TypeError, ValueError):
            raise ConfigError(
                f"router.min_min.decode_edges_tokens={self.decode_edges_tokens!r} must be integers") from None
        if any(e <= 0 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
            raise ConfigError(f"router.min_min.decode_edges_tokens={list(edges)} must be positive and "
                              "strictly ascending")
        object.__setattr__(self, "decode_edges_tokens", edges)


class MinMin(RouterBase):
    """Shortest job first (prompt + decode-bucket upper bound) onto the smallest backlog.

    Implements ``select_from_queue``: drivers let it pick any queued request. ``select`` (head
    only) is there for drivers that cannot reorder; it then only chooses the instance.
    """

    name = "min_min"
    Options = MinMinOptions

    def job_tokens(self, cluster, rid: int) -> float:
        tb = cluster.table
        edges = self.options.decode_edges_tokens
        b = tb.decode_bucket[rid]
        if b < len(edges):
            decode = edges[b]
        elif b == len(edges):
            decode = tb.pred[rid]
        else:
            raise ValueError(
                f"router min_min: request {rid} is in decode bucket {b} but decode_edges_tokens "
                f"{list(edges)} define {len(edges) + 1} buckets; pass the env's bucket edges")
        return tb.prompt[rid] + decode

    def ready_instance(self, cluster) -> int:
        """The earliest-ready instance: least backlog (mixed cluster: in seconds)."""
        if cluster.speeds.homogeneous:
            return argmin(work_left_tokens(e) for e in cluster.engines)
        return argmin(load_s(cluster, i, work_left_tokens(e)) for i, e in enumerate(cluster.engines))

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        return self.ready_instance(cluster)

    def select_from_queue(self, cluster) -> tuple[int, int] | None:
        self._require_reset(cluster)
        if not cluster.queue:
            return None
        pos = argmin(self.job_tokens(cluster, rid) for rid in cluster.queue)
        return pos, self.ready_instance(cluster)
