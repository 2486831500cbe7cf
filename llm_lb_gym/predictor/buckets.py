"""Bucket schemes: how a decode (or prompt) length maps to a class.

The router never sees the true output length; it sees a bucket. Two families are used in the
paper: completion-time buckets (0-0.5 s, 0.5-2 s, 2-4 s, >4 s of decoding at a stated
tokens/s rate) and equal-width token buckets (its 250-token ablation). Edges are exact: a value
equal to an edge falls in the upper bucket (``searchsorted(..., side="right")``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validate import ConfigError, check_int, check_range


@dataclass(frozen=True)
class BucketScheme:
    """Buckets over token counts: bucket i holds edges[i-1] <= x < edges[i]."""

    edges_tokens: tuple[int, ...]
    """Ascending interior edges; ``len(edges) + 1`` buckets, the last one unbounded."""
    representative_tokens: tuple[float, ...] = ()
    """Point estimate of the length of each bucket (used as the predicted decode tokens);
    defaults to each bounded bucket's midpoint and 1.5x the last edge for the open bucket."""
    name: str = "tokens"

    def __post_init__(self) -> None:
        edges = tuple(int(e) for e in self.edges_tokens)
        if any(e <= 0 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
            raise ConfigError(f"bucket edges_tokens={list(self.edges_tokens)} must be positive and strictly ascending")
        object.__setattr__(self, "edges_tokens", edges)
        if not self.representative_tokens:
            lows = (0,) + edges
            reps = [(lo + hi) / 2 for lo, hi in zip(lows, edges)] + [1.5 * edges[-1] if edges else 1.0]
            object.__setattr__(self, "representative_tokens", tuple(float(r) for r in reps))
        if len(self.representative_tokens) != self.num_buckets:
            raise ConfigError(
                f"bucket representative_tokens has {len(self.representative_tokens)} values, "
                f"expected {self.num_buckets}"
            )

    @property
    def num_buckets(self) -> int:
        return len(self.edges_tokens) + 1

    def bucket(self, tokens) -> np.ndarray:
        """Bucket index of each token count (vectorised)."""
        return np.searchsorted(np.asarray(self.edges_tokens), np.asarray(tokens), side="right")

    def bucket_of(self, tokens: int) -> int:
        """Bucket index of one token count (scalar fast path for the simulator's hot loop)."""
        i = 0
        for e in self.edges_tokens:
            if tokens < e:
                return i
            i += 1
        return i

    def representative(self, buckets) -> np.ndarray:
        return np.asarray(self.representative_tokens)[np.asarray(buckets)]

    def labels(self) -> list[str]:
        lows = (0,) + self.edges_tokens
        out = [f"[{lo},{hi})" for lo, hi in zip(lows, self.edges_tokens)]
        return out + [f">={self.edges_tokens[-1]}" if self.edges_tokens else "all"]

    @staticmethod
    def equal_width(width_tokens: int, num_buckets: int) -> "BucketScheme":
        """``num_buckets`` buckets of ``width_tokens`` each, the last open (paper: 250 tokens)."""
        check_int("bucket.width_tokens", width_tokens, 1)
        check_int("bucket.num_buckets", num_buckets, 2)
        return BucketScheme(tuple(width_tokens * i for i in range(1, num_buckets)),
                            name=f"equal{width_tokens}x{num_buckets}")

    @staticmethod
    def completion_time(edges_s=(0.5, 2.0, 4.0), decode_tokens_per_s: float = 60.0) -> "BucketScheme":
        """Buckets by decode time at ``decode_tokens_per_s`` (a single sequence's decode rate).

        At 60 tok/s (one Llama-2-7B sequence on a V100, 16.6 ms per step) the default edges are
        30, 120 and 240 tokens.
        """
        check_range("bucket.decode_tokens_per_s", decode_tokens_per_s, 0.0, lo_open=True)
        edges = tuple(max(1, int(round(s * decode_tokens_per_s))) for s in edges_s)
        return BucketScheme(edges, name=f"time{'-'.join(str(s) for s in edges_s)}s@{decode_tokens_per_s:g}tps")


# Named schemes usable from configs.
SCHEMES = {
    "paper_dqn": lambda: BucketScheme((256, 2048), name="paper_dqn"),
    "time4": lambda: BucketScheme.completion_time(),
    "equal250": lambda: BucketScheme.equal_width(250, 4),
}
