"""How fast and how large each instance of a (possibly mixed) cluster is: the one definition.

Routers that reason about load, the env's reward and its observation all need to compare
instances that differ in GPU, model or engine options. They read it from here, so "speed" means
one thing everywhere:

- **estimated service time** of request j on instance i, ``service_s(i, p, d)``: the latency of
  j alone on an idle instance i with its *predicted* decode length d (``LatencyModel.
  isolated_request_s``: one prefill, then d - 1 decode steps), from i's own latency model;
- **reference time** of instance i: the service time there of the reference request
  (``REFERENCE_PROMPT_TOKENS`` + ``REFERENCE_DECODE_TOKENS``: the paper's 1,000 / 1,000, 17 s on
  the V100 preset), and its **seconds per token** ``token_s[i]`` = reference time / 2,000: what
  converts a backlog in tokens (JSQ's measure) into seconds on that instance;
- **relative speed** ``relative_speed[i]`` = the fastest instance's reference time / i's, in
  (0, 1], 1 for the fastest (the observation's ``speed`` feature);
- **KV size** ``kv_tokens[i]`` = i's KV-cache blocks x block size;
- **ideal latency** T_j of the env's reward: j's service time on the instance that serves it
  fastest (the minimum over the cluster's latency models), as its client sees it: behind an API
  server's frontend (``engine.frontend``) after the frontend's delay and input work
  (``FrontendModel.seen_s``; the SLO's isolated TTFT adds the same). It stays a per-request
  constant known at arrival, and no routing choice can beat it, so 1/T_j weighs every request
  by its best case. Why the frontend counts: a 128 / 4-token request on an H100 takes ~20 ms in
  the engine and ~45 ms more in vLLM's API server; without it the penalty charged such a
  request three times its real slowdown.

Load-balancing routers compare backlogs in seconds: backlog tokens x ``token_s[i]``, ties to the
faster instance (``routers/base.load_s``, which says why the request's own service time is not
added there). In a homogeneous cluster every instance has relative speed exactly 1.0 and T_j is the instance's
ideal latency, bit for bit as before; ``homogeneous`` tells routers to keep their token-count
rules there (any rescaling could reorder ties by rounding).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .config import EngineConfig
from .latency import ideal_latency_s

REFERENCE_PROMPT_TOKENS = 1000
REFERENCE_DECODE_TOKENS = 1000


class InstanceSpeeds:
    """Per-instance speed and capacity of a cluster (read-only; built once per cluster)."""

    def __init__(self, engines: Sequence[EngineConfig]):
        if not engines:
            raise ValueError("InstanceSpeeds needs at least one engine config")
        first = engines[0]
        self.homogeneous = all(e == first for e in engines)
        self.latency = [e.latency_model for e in engines]
        """Each instance's latency model (shared objects where the configs are equal)."""
        ref = [lat.isolated_request_s(REFERENCE_PROMPT_TOKENS, REFERENCE_DECODE_TOKENS)
               for lat in self.latency]
        self.reference_s = ref
        fastest = min(ref)
        self.relative_speed = [fastest / r for r in ref]
        self.fastest_latency = self.latency[ref.index(fastest)]
        """Latency model of the fastest instance type: the basis of T_j's and SLO multiples."""
        self.fastest_engine = engines[ref.index(fastest)]
        """Its engine config (the SLO multiples read its frontend and scheduling too)."""
        self.token_s = [r / (REFERENCE_PROMPT_TOKENS + REFERENCE_DECODE_TOKENS) for r in ref]
        self.kv_tokens = [e.total_blocks * e.block_size for e in engines]
        # Distinct (latency model, frontend) pairs, for T_j (one pair in a homogeneous cluster).
        self._models = list(dict.fromkeys((e.latency_model, e.frontend_model) for e in engines))

    def service_s(self, instance: int, prompt_tokens: int, pred_decode_tokens: float) -> float:
        """Estimated service time (s) of a request alone on ``instance`` (predicted decode length,
        truncated to whole tokens as ``isolated_request_s`` takes them)."""
        return self.latency[instance].isolated_request_s(prompt_tokens, pred_decode_tokens)

    def backlog_s(self, instance: int, work_tokens: float) -> float:
        """A backlog of ``work_tokens`` tokens (prompt to prefill + predicted decode to generate)
        in seconds of ``instance``'s time."""
        return work_tokens * self.token_s[instance]

    def ideal_latency_s(self, prompt_tokens, pred_decode_tokens) -> np.ndarray:
        """T_j of the env's reward: the least ideal latency over the cluster's instance types."""
        models = self._models
        out = ideal_s(*models[0], prompt_tokens, pred_decode_tokens)
        for lat, frontend in models[1:]:
            out = np.minimum(out, ideal_s(lat, frontend, prompt_tokens, pred_decode_tokens))
        return out


def ideal_s(latency, frontend, prompt_tokens, pred_decode_tokens) -> np.ndarray:
    """A request's ideal latency on one instance type: alone on it, its predicted decode length
    (``latency.ideal_latency_s``), as the client sees it behind ``frontend`` (None: none). The
    env's T_j (the least over a cluster's types), the router service's (``serve/view.py``) and
    the lockstep check's (``serve/lockstep.py``) all come from here."""
    out = ideal_latency_s(latency, prompt_tokens, pred_decode_tokens)
    return out if frontend is None else frontend.seen_s(out, prompt_tokens)
