"""A production-gateway scorer: weighted KV-cache utilisation plus queue depth, lowest wins.

LLM-aware gateways in front of vLLM (the Kubernetes Gateway API Inference Extension's endpoint
picker, llm-d's scheduler, AIBrix) score each replica from the metrics vLLM exports - KV-cache
usage (``gpu_cache_usage_perc``), requests waiting (``num_requests_waiting``) and running - and
send the request to the best score. They know nothing of the request itself, which makes this
the natural "what production does today" baseline for a workload-aware router.

score_i = w_kv * used_i / total_i + w_queue * waiting_i / max_num_seqs
          + w_running * running_i / max_num_seqs

Both counts are normalised by the batch limit so all terms are on comparable 0-1-ish scales.
Defaults weigh KV utilisation and queue depth equally and leave the running share out
(``w_running = 0``), the neutral choice: the gateways expose these weights as configuration
rather than fixing them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validate import ConfigError, check_range
from .base import RouterBase, argmin


@dataclass(frozen=True)
class KVQueueOptions:
    w_kv: float = 1.0
    """Weight of KV-cache utilisation (used blocks / total blocks)."""
    w_queue: float = 1.0
    """Weight of the waiting-queue depth (waiting requests / max_num_seqs)."""
    w_running: float = 0.0
    """Weight of the running share (running + prefilling requests / max_num_seqs)."""

    def __post_init__(self) -> None:
        for name in ("w_kv", "w_queue", "w_running"):
            check_range(f"router.kv_queue_scorer.{name}", getattr(self, name), 0.0)
        if self.w_kv + self.w_queue + self.w_running == 0.0:
            raise ConfigError("router.kv_queue_scorer: w_kv, w_queue and w_running are all 0; "
                              "allowed: at least one > 0")


class KVQueueScorer(RouterBase):
    name = "kv_queue_scorer"
    Options = KVQueueOptions

    def score(self, engine) -> float:
        o = self.options
        # free_blocks, not used: an engine's ``used`` lags its decode iterations until synced.
        used = engine.total_blocks - engine.free_blocks
        s = o.w_kv * used / engine.total_blocks + o.w_queue * engine.num_waiting / engine.max_seqs
        if o.w_running:
            s += o.w_running * (engine.B + len(engine.prefilling)) / engine.max_seqs
        return s

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        return argmin(self.score(e) for e in cluster.engines)
