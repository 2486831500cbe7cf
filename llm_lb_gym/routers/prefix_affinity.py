"""Prefix-affinity routers: send a request where its prompt prefix is cached, unless that
instance is much busier than the rest.

Production gateways in front of vLLM route first on KV-cache prefix affinity: the Gateway API
Inference Extension / llm-d scheduler weighs a prefix-cache scorer (share of the prompt's
blocks cached on the pod) against queue-depth and KV-utilisation scorers; SGLang's router
sends a request to the worker with the longest matching prefix unless the load is imbalanced.
Both come in two flavours, and so do these routers:

- ``prefix_affinity``: asks each instance's engine how much of the head request's prompt it
  holds cached (``Engine.cached_prefix_tokens``; exact, as with KV-cache events from vLLM);
- ``prefix_affinity_approx``: no engine introspection: it remembers which hash blocks it sent
  to each instance, forgetting the least recently sent beyond ``capacity_blocks`` per instance
  (llm-d's and SGLang's approximate prefix index). It does not know about evictions, so it may
  believe in blocks the engine dropped.

score_i = matched_prefix_i / prompt - load_weight * (used_i / total_i + waiting_i / max_num_seqs)

the highest wins (ties: lowest index). The load term is ``kv_queue_scorer``'s default; with
``load_weight = 0`` the router is pure affinity (and piles conversations onto one instance).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validate import check_int, check_range
from .base import RouterBase, argmax


@dataclass(frozen=True)
class PrefixAffinityOptions:
    load_weight: float = 1.0
    """Weight of the load term against the matched share of the prompt (0: affinity only)."""

    def __post_init__(self) -> None:
        check_range("router.prefix_affinity.load_weight", self.load_weight, 0.0, 1e6)


def _load(engine) -> float:
    return engine.used / engine.total_blocks + engine.num_waiting / engine.max_seqs


class PrefixAffinity(RouterBase):
    name = "prefix_affinity"
    Options = PrefixAffinityOptions

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        w = self.options.load_weight
        p = cluster.table.prompt[rid]
        return argmax(e.cached_prefix_tokens(rid) / p - w * _load(e) for e in cluster.engines)


@dataclass(frozen=True)
class PrefixAffinityApproxOptions:
    load_weight: float = 1.0
    """Weight of the load term against the matched share of the prompt (0: affinity only)."""
    capacity_blocks: int = 0
    """Hash blocks remembered per instance (LRU); 0 = as many as fit the instance's KV cache
    (its configured size, not its state)."""

    def __post_init__(self) -> None:
        check_range("router.prefix_affinity_approx.load_weight", self.load_weight, 0.0, 1e6)
        check_int("router.prefix_affinity_approx.capacity_blocks", self.capacity_blocks, 0)


class PrefixAffinityApprox(RouterBase):
    name = "prefix_affinity_approx"
    Options = PrefixAffinityApproxOptions

    def reset(self, rng, num_instances: int) -> None:
        super().reset(rng, num_instances)
        self.sent: list[dict] = [{} for _ in range(num_instances)]   # hash id -> None, LRU order
        self.capacity = self.options.capacity_blocks

    def _matched(self, i: int, hs: tuple, H: int, p: int) -> int:
        sent, n, limit = self.sent[i], 0, min(len(hs), (p - 1) // H)
        while n < limit and hs[n] in sent:
            n += 1
        return n * H

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        tb = cluster.table
        hs, H, p = tb.hashes[rid], tb.hash_block_tokens, tb.prompt[rid]
        w = self.options.load_weight
        if hs is None or not H:
            return argmax(-w * _load(e) for e in cluster.engines)
        i = argmax(self._matched(k, hs, H, p) / p - w * _load(e)
                   for k, e in enumerate(cluster.engines))
        self._remember(i, hs[:min(len(hs), p // H)], cluster, H)
        return i

    def _remember(self, i: int, blocks: tuple, cluster, H: int) -> None:
        if not self.capacity:   # the configured KV cache of one instance, in hash blocks
            e = cluster.engines[0]
            self.capacity = max(1, e.total_blocks * e.bs // H)
        sent = self.sent[i]
        for h in blocks:
            sent.pop(h, None)
            sent[h] = None
        while len(sent) > self.capacity:
            del sent[next(iter(sent))]
