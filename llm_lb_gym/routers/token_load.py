"""Routers that balance token work, measured with predicted output lengths.

The paper's token-aware baselines (App. A.1-A.2): Join Shortest Queue in tokens, the Decode
Balancer, and Dedicated Small-Large. All three read the engines' O(1) aggregates
(``pending_prefill_tokens``, ``decode_tokens_left()``) and the request's predicted decode
tokens, never its true length. In a mixed cluster each instance's backlog is converted to
seconds of its own time, ties to the faster instance (``base.load_s``): a token on a V100 takes
longer than on an A100.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validate import check_range
from .base import RouterBase, argmin, load_s, work_left_tokens


class JoinShortestQueue(RouterBase):
    """The instance with the fewest prompt + predicted decode tokens yet to be processed (mixed
    cluster: the least of them in seconds of each instance's time, ``base.load_s``)."""

    name = "jsq"

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        if cluster.speeds.homogeneous:
            return argmin(work_left_tokens(e) for e in cluster.engines)
        return argmin(load_s(cluster, i, work_left_tokens(e)) for i, e in enumerate(cluster.engines))


class DecodeBalancer(RouterBase):
    """The instance with the fewest predicted decode tokens still to generate.

    The paper's version assumes output lengths are known; here it balances whatever the
    predictor says (the oracle predictor recovers the paper's setting). Prompt work is ignored
    on purpose: that is what distinguishes it from JSQ. Mixed cluster: decode tokens left in
    seconds of each instance's time (``base.load_s``).
    """

    name = "decode_balancer"

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        if cluster.speeds.homogeneous:
            return argmin(e.decode_tokens_left() for e in cluster.engines)
        return argmin(load_s(cluster, i, e.decode_tokens_left()) for i, e in enumerate(cluster.engines))


@dataclass(frozen=True)
class DedicatedOptions:
    heavy_decode_tokens: float = 300.0
    """A request is heavy when its predicted decode tokens reach this. 300 tokens is the paper's
    heavy-decode threshold (decode phase >= 5 s) at ~16.6 ms per token (Llama-2-7B, V100)."""
    heavy_share: float = 0.5
    """Share of the instances dedicated to heavy requests: share * m rounded half up, at least one, and
    at most m - 1 so light requests keep one (with m = 1 both groups are instance 0). The paper's
    two-instance study dedicates one instance to each class, i.e. 0.5."""

    def __post_init__(self) -> None:
        check_range("router.dedicated_small_large.heavy_decode_tokens", self.heavy_decode_tokens, 0.0,
                    lo_open=True)
        check_range("router.dedicated_small_large.heavy_share", self.heavy_share, 0.0, 1.0,
                    lo_open=True, hi_open=True)


class DedicatedSmallLarge(RouterBase):
    """Heavy-decode requests to a dedicated group of instances, the rest to the others.

    Heavy instances are the last ``k`` indices (light requests keep the low indices, so with
    ties-to-lowest both groups fill from their first member). Within a group the request goes to
    the instance with the least token work left (JSQ's measure), ties to the lowest index.
    The point of the policy is isolation: short requests never queue behind long decodes.
    Mixed cluster: the groups stay index-based (order the instances so that the heavy group is
    the one you want), and within a group the measure is JSQ's in seconds (``base.load_s``).
    """

    name = "dedicated_small_large"
    Options = DedicatedOptions

    def reset(self, rng, num_instances: int) -> None:
        super().reset(rng, num_instances)
        m = num_instances
        k = 1 if m == 1 else min(max(1, int(self.options.heavy_share * m + 0.5)), m - 1)
        self.heavy_instances = tuple(range(m - k, m))
        self.light_instances = tuple(range(m - k)) if m > 1 else (0,)

    def is_heavy(self, cluster, rid: int) -> bool:
        return cluster.table.pred[rid] >= self.options.heavy_decode_tokens

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        group = self.heavy_instances if self.is_heavy(cluster, rid) else self.light_instances
        eng = cluster.engines
        if cluster.speeds.homogeneous:
            return group[argmin(work_left_tokens(eng[i]) for i in group)]
        return group[argmin(load_s(cluster, i, work_left_tokens(eng[i])) for i in group)]
