"""The release guarantee: no holding router keeps a request at the router without bound.

A router that may hold (``defers = True``: late_binding, scored_binding, max_capacity,
lookahead, any user router that declares it) decides *when* a request leaves the router queue,
and some of its options can remove every release: ``late_binding`` with ``period_s=1e9`` opens
one round and never another, ``scored_binding`` with ``room_margin=1.0`` finds no instance with
room ever (0.5 on the KV-limited preset for the requests larger than half a cache). An episode,
a rollout or a served request would then wait forever. So whatever a holding router's options
say, its hold is overridden here, in one place that no option reaches:

- **hard cap**: the router-queue head (the oldest held request) has waited more than
  ``MAX_HOLD_S`` (an hour of simulated or served time);
- **nothing to wait for**: no instance is running or prefilling anything (so no KV room or
  sequence slot will come free by waiting, only new arrivals), and the head has waited more
  than ``IDLE_HOLD_S``. Within one decision time every held request older than that goes out,
  as routed requests wait at their instance and run nothing yet.

The overridden head goes to the instance with the fewest requests (running, prefilling and
waiting there; ties to the most free KV blocks, then the lowest index). Every instance can take
it: the cluster rejects at arrival, with its reason (``exceeds_kv_capacity``,
``exceeds_max_model_len``, ...), a request that does not fit every instance, so a queued request
never needs a particular instance and nothing held is one that can never run.

How it is applied: ``RouterBase.__init_subclass__`` wraps the ``select`` and
``select_from_queue`` a holding router class defines (:func:`bounded_select`,
:func:`bounded_select_from_queue`), so every caller (``drive.decide``, the rollout operator's
``base_route_all``, the env's teacher and fallback, the router service) gets the guarantee,
and a new router gets it by declaring ``defers = True``. It costs one comparison per hold.

Why these bounds leave every shipped decision as it was: measured on every
``conf/experiment`` setting with its own router options (2 episodes each, package 0.7.0,
``/tmp`` probe wrapping ``select_from_queue``), the longest router wait of a holding router was
464 s (max_capacity on ``paper_v100_kv_limited``; late_binding 371 s, scored_binding 381 s) and
the longest hold with nothing running 0.96 s (max_capacity's 1 s rounds). Settings that hold
requests longer than an hour, or hold them a minute on an idle cluster, are changed by design.
"""

from __future__ import annotations

import functools

MAX_HOLD_S = 3600.0
"""Longest a holding router may keep the router-queue head (seconds since its arrival)."""

IDLE_HOLD_S = 60.0
"""Longest a holding router may keep the head while no instance runs or prefills anything."""


def release_due(cluster) -> bool:
    """Whether the router-queue head may not be held any longer (module doc)."""
    q = cluster.queue
    if not q:
        return False
    wait = cluster.t - cluster.table.arrival_s[q[0]]
    if not wait > IDLE_HOLD_S:   # nearly every hold ends here
        return False
    if wait > MAX_HOLD_S:
        return True
    for e in cluster.engines:
        if e.B or e.prefilling:
            return False
    return True


def release_instance(cluster) -> int:
    """Where an overridden hold sends the head: the instance with the fewest requests on it,
    ties to the most free KV blocks, then to the lowest index."""
    best, best_key = 0, None
    for i, e in enumerate(cluster.engines):
        key = (e.B + len(e.prefilling) + e.num_waiting, -e.free_blocks)
        if best_key is None or key < best_key:
            best, best_key = i, key
    return best


def bounded_select(select):
    """``select`` (head -> instance or None) whose hold :func:`release_due` overrides."""
    @functools.wraps(select)
    def wrapped(self, cluster, rid):
        choice = select(self, cluster, rid)
        if choice is None and release_due(cluster) and rid == cluster.queue[0]:
            return release_instance(cluster)
        return choice

    wrapped.release_bounded = True
    return wrapped


def bounded_select_from_queue(select_from_queue):
    """``select_from_queue`` (-> (position, instance) or None) whose hold :func:`release_due`
    overrides: the head goes out."""
    @functools.wraps(select_from_queue)
    def wrapped(self, cluster):
        choice = select_from_queue(self, cluster)
        if choice is None and release_due(cluster):
            return 0, release_instance(cluster)
        return choice

    wrapped.release_bounded = True
    return wrapped


def bound_holds(cls) -> None:
    """Wrap the deciding methods of ``cls`` if it may hold (``cls.defers``) and they are not
    wrapped yet (inherited from a holding parent, they are)."""
    if not cls.defers:
        return
    for name, wrap in (("select", bounded_select), ("select_from_queue", bounded_select_from_queue)):
        fn = getattr(cls, name, None)
        if fn is not None and not getattr(fn, "release_bounded", False):
            setattr(cls, name, wrap(fn))
