"""Routers by name, built from plain keyword options (Hydra's ``conf/``, the evaluate script).

``make_router("dedicated_small_large", heavy_share=0.25)`` builds the router's typed options
from the keywords; a wrong name lists the valid names, a wrong keyword names itself and the
router's valid options, and a bad value names the option and its allowed range.
"""

from __future__ import annotations

import sys
from dataclasses import fields

from .._validate import lookup, reject_unknown
from .base import RouterBase
from .count_based import LeastRequests, PowerOfTwo, Random, RoundRobin
from .kv_queue import KVQueueScorer
from .late_binding import LateBinding
from .lookahead import Lookahead
from .max_capacity import MaxCapacity
from .min_min import MinMin
from .mixing_greedy import MixingGreedy
from .prefix_affinity import PrefixAffinity, PrefixAffinityApprox
from .scored_binding import ScoredBinding
from .slo_aware import SLOAware
from .token_load import DecodeBalancer, DedicatedSmallLarge, JoinShortestQueue

_CLASSES: tuple[type[RouterBase], ...] = (
    RoundRobin, Random, JoinShortestQueue, MaxCapacity, MinMin, DecodeBalancer,
    DedicatedSmallLarge, LeastRequests, PowerOfTwo, MixingGreedy, KVQueueScorer, LateBinding,
    Lookahead, PrefixAffinity, PrefixAffinityApprox, SLOAware, ScoredBinding,
)
ROUTER_CLASSES: dict[str, type[RouterBase]] = {cls.name: cls for cls in _CLASSES}
ROUTERS: tuple[str, ...] = tuple(ROUTER_CLASSES)
"""Every router name: DESIGN.md section 6's, then the ones added beyond it."""


def register_router(cls: type[RouterBase]) -> type[RouterBase]:
    """Add a router class defined outside this package to the registry (usable as a decorator).

    Routers in the package are listed in ``_CLASSES`` instead; this is for a user's own module,
    so that ``make_router``, ``make_env_router``, the env's ``reward.teacher`` and
    ``action.fallback_router`` accept its name like a built-in one (README, "How to extend").
    The name must be new: replacing a built-in router silently would change every table that
    names it.
    """
    global ROUTERS
    if not (isinstance(cls, type) and issubclass(cls, RouterBase)):
        raise TypeError(f"register_router takes a RouterBase subclass, got {cls!r}")
    if not cls.name:
        raise ValueError(f"{cls.__name__}.name is empty: set the class attribute name = '...'")
    if ROUTER_CLASSES.get(cls.name, cls) is not cls:
        raise ValueError(f"router name {cls.name!r} is taken by {ROUTER_CLASSES[cls.name].__name__}")
    ROUTER_CLASSES[cls.name] = cls
    ROUTERS = tuple(ROUTER_CLASSES)
    package = sys.modules.get(__package__)
    if package is not None and hasattr(package, "ROUTERS"):
        package.ROUTERS = ROUTERS   # the package re-exports the tuple
    return cls


def router_options(name: str) -> tuple[str, ...]:
    """The keyword options router ``name`` accepts."""
    return tuple(f.name for f in fields(lookup("router", ROUTER_CLASSES, name).Options))


def make_router(name: str, **options) -> RouterBase:
    """A fresh router (call ``reset(rng, num_instances)`` before use)."""
    cls = lookup("router", ROUTER_CLASSES, name)
    reject_unknown(f"router {name!r}", options, (f.name for f in fields(cls.Options)))
    return cls(cls.Options(**options))
