"""Heuristic routers: the paper's baselines and production load balancers' policies.

All share one interface (``base.Router``): ``reset(rng, num_instances)`` then
``select(cluster, head_rid) -> instance | None``; Min-Min also reorders the queue through
``select_from_queue``. ``make_router(name, **options)`` builds one by name; ``run_router``
drives the simulator with one, without the Gymnasium layer.
"""

from .base import QueueRouter, Router, RouterBase, work_left_tokens
from .count_based import LeastRequests, PowerOfTwo, Random, RoundRobin
from .drive import decide, run_router
from .kv_queue import KVQueueOptions, KVQueueScorer
from .late_binding import LateBinding, LateBindingOptions
from .max_capacity import MaxCapacity, MaxCapacityOptions
from .min_min import MinMin, MinMinOptions
from .mixing_greedy import MixingGreedy, MixingGreedyOptions
from .slo_aware import SLOAware, SLOAwareOptions
from .registry import ROUTER_CLASSES, ROUTERS, make_router, register_router, router_options
from .token_load import DecodeBalancer, DedicatedOptions, DedicatedSmallLarge, JoinShortestQueue

__all__ = [
    "Router", "QueueRouter", "RouterBase", "work_left_tokens",
    "RoundRobin", "Random", "LeastRequests", "PowerOfTwo",
    "JoinShortestQueue", "DecodeBalancer", "DedicatedSmallLarge", "DedicatedOptions",
    "MaxCapacity", "MaxCapacityOptions", "MinMin", "MinMinOptions",
    "MixingGreedy", "MixingGreedyOptions", "KVQueueScorer", "KVQueueOptions",
    "SLOAware", "SLOAwareOptions",
    "ROUTERS", "ROUTER_CLASSES", "make_router", "register_router", "router_options", "decide", "run_router",
]
