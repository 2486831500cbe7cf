"""The router's observation: router queue, head request, and per-instance state.

Flat layout (``ObsConfig.as_dict=False``), with n_p prompt and n_d decode buckets:

| index | feature | raw unit | normalised by |
|---|---|---|---|
| 0 | router queue length, capped at ``queue_cap`` | requests | queue_cap |
| 1 | head request's prompt tokens (0 if the queue is empty) | tokens | context length |
| 2 | head request's predicted decode bucket | bucket index | n_d - 1 |
| 3 | head request's predicted decode tokens | tokens | context length |
| 4 + i*(n_p+n_d+2) + b | P[i, b]: requests in prompt phase (waiting or prefilling) on instance i with prompt bucket b | requests | max_num_seqs |
| ... + n_p + b | D[i, b]: requests in decode phase on instance i with predicted decode bucket b | requests | max_num_seqs |
| ... + n_p + n_d | capacity C[i] = 1 - committed tokens / KV-cache tokens, clipped to [-1, 1] | share | - |
| ... + n_p + n_d + 1 | predicted time until instance i's first running request completes | s | time_scale_s |

"Committed tokens" = prompt + predicted decode tokens of every request routed to the instance
and not finished: the KV the instance will need if nothing finishes, which is why it is the
capacity signal (it changes only at routing and completion events, so it costs nothing per step).
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from ..predictor.buckets import BucketScheme
from .config import ObsConfig


class ObservationBuilder:
    def __init__(self, cfg: ObsConfig, num_instances: int, num_requests: int, max_num_seqs: int,
                 context_len: int, kv_tokens: int):
        self.cfg = cfg
        self.m = num_instances
        self.prompt_scheme = BucketScheme(cfg.prompt_edges_tokens, name="obs_prompt")
        self.decode_scheme = BucketScheme(cfg.decode_edges_tokens, name="obs_decode")
        self.n_p, self.n_d = self.prompt_scheme.num_buckets, self.decode_scheme.num_buckets
        self.per = self.n_p + self.n_d + 2
        self.size = 4 + self.m * self.per
        self.kv_tokens = float(kv_tokens)
        norm = cfg.normalize
        self.s_queue = 1.0 / cfg.queue_cap if norm else 1.0
        self.s_tok = 1.0 / context_len if norm else 1.0
        self.s_bucket = 1.0 / max(self.n_d - 1, 1) if norm else 1.0
        self.s_count = 1.0 / max_num_seqs if norm else 1.0
        self.s_time = 1.0 / cfg.time_scale_s if norm else 1.0
        self.round = cfg.round_decimals
        self._round_idx = [j for i in range(self.m)
                           for j in (4 + i * self.per + self.n_p + self.n_d,
                                     4 + i * self.per + self.n_p + self.n_d + 1)]
        hi = np.empty(self.size, np.float32)
        lo = np.zeros(self.size, np.float32)
        hi[0] = cfg.queue_cap * self.s_queue
        hi[1] = hi[3] = context_len * self.s_tok * 4   # predicted tokens may exceed the context
        hi[2] = (self.n_d - 1) * self.s_bucket
        for i in range(self.m):
            o = 4 + i * self.per
            hi[o:o + self.n_p + self.n_d] = num_requests * self.s_count
            lo[o + self.n_p + self.n_d] = -1.0
            hi[o + self.n_p + self.n_d] = 1.0
            hi[o + self.n_p + self.n_d + 1] = np.float32(1e6) * self.s_time
        self.low, self.high = lo, hi
        scale = np.ones(self.size, np.float32)
        scale[:4] = (self.s_queue, self.s_tok, self.s_bucket, self.s_tok)
        for i in range(self.m):
            o = 4 + i * self.per
            scale[o:o + self.n_p + self.n_d] = self.s_count
            scale[o + self.n_p + self.n_d + 1] = self.s_time
        self.scale = scale
        self.box = spaces.Box(lo, hi, dtype=np.float32)

    def space(self) -> spaces.Space:
        if not self.cfg.as_dict:
            return self.box
        m, n_p, n_d = self.m, self.n_p, self.n_d
        per = self.per
        sl = lambda a, b: (self.low[a:b], self.high[a:b])  # noqa: E731
        P_lo = np.stack([self.low[4 + i * per: 4 + i * per + n_p] for i in range(m)])
        P_hi = np.stack([self.high[4 + i * per: 4 + i * per + n_p] for i in range(m)])
        D_lo = np.stack([self.low[4 + i * per + n_p: 4 + i * per + n_p + n_d] for i in range(m)])
        D_hi = np.stack([self.high[4 + i * per + n_p: 4 + i * per + n_p + n_d] for i in range(m)])
        q_lo, q_hi = sl(0, 4)
        return spaces.Dict({
            "queue": spaces.Box(q_lo, q_hi, dtype=np.float32),
            "prompt_counts": spaces.Box(P_lo, P_hi, dtype=np.float32),
            "decode_counts": spaces.Box(D_lo, D_hi, dtype=np.float32),
            "capacity": spaces.Box(-1.0, 1.0, (m,), dtype=np.float32),
            "earliest_completion": spaces.Box(0.0, float(self.high[4 + per - 1]), (m,), dtype=np.float32),
        })

    def observe(self, cluster):
        """Build the observation from the cluster's O(1) aggregates."""
        tb = cluster.table
        q = cluster.queue
        if q:
            h = q[0]
            vals = [min(len(q), self.cfg.queue_cap), tb.prompt[h], tb.decode_bucket[h], tb.pred[h]]
        else:
            vals = [0, 0, 0, 0]
        kv = self.kv_tokens
        for e in cluster.engines:
            e.observe_into(vals, kv)
        if self.round is not None:
            rnd = self.round
            for i in self._round_idx:
                vals[i] = round(vals[i], rnd)
        flat = np.array(vals, dtype=np.float32)
        flat *= self.scale
        if not self.cfg.as_dict:
            return flat
        return self.to_dict(flat)

    def to_dict(self, flat: np.ndarray) -> dict:
        m, n_p, n_d, per = self.m, self.n_p, self.n_d, self.per
        inst = flat[4:].reshape(m, per)
        return {
            "queue": flat[:4].copy(),
            "prompt_counts": inst[:, :n_p].copy(),
            "decode_counts": inst[:, n_p:n_p + n_d].copy(),
            "capacity": inst[:, n_p + n_d].copy(),
            "earliest_completion": inst[:, n_p + n_d + 1].copy(),
        }
