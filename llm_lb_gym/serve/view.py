"""The router service's view of its backends, shaped like the simulator's cluster.

Routers (``routers/``) decide from a ``Cluster``: ``t``, the router ``queue``, the request
``table`` and per-instance ``engines`` with load aggregates (``routers/base.py`` lists what
they may read). The service builds the same shape from what a router in front of real servers
can know, so a registered router decides the same way in simulation and in service:

- its own in-flight table per backend (exact and immediate): requests sent, each one's prompt
  tokens, predicted output tokens and tokens streamed back so far (``table.o_base``); a request
  is *unstarted* until its first token arrives;
- the backend's polled Prometheus metrics (``scrape.py``; stale by up to a poll interval):
  requests running / waiting, KV-cache usage, and for vLLM the KV cache size.

How they combine (one place, here): counts and token sums come from the in-flight table.
``num_waiting`` is the polled waiting count plus requests sent since that poll that have not
started (a request the backend has not seen yet is waiting there too), capped at the in-flight
count; without metrics it is the unstarted count. ``B`` (running) is the rest. ``used`` KV
blocks is the larger of the polled usage and the blocks of the started requests' tokens.
Non-streamed requests show no tokens until they end, so for them the polled counts are what
splits running from waiting.

``table`` rows are request slots, recycled when a request ends (the ids are the service's, not
an episode's), so a long-running service holds memory for its peak concurrency only.
"""

from __future__ import annotations

import math
import time
from collections import deque

from .scrape import BackendLoad


class ServiceTable:
    """Columns routers read, one row per live request slot (``routers/base.py``)."""

    _COLUMNS = ("prompt", "pred", "arrival_s", "o_base", "inv_ideal", "task_id", "prompt_bucket",
                "decode_bucket", "hashes", "ttft_deadline_s", "tbt_deadline_s", "epoch")
    hash_block_tokens = 0
    slo_on = False

    def __init__(self):
        self.n = 0
        for c in self._COLUMNS:
            setattr(self, c, [])
        self._free: list[int] = []

    def add(self, prompt: int, pred: float, arrival_s: float, inv_ideal: float,
            prompt_bucket: int = 0, decode_bucket: int = 0) -> int:
        if self._free:
            rid = self._free.pop()
        else:
            rid = self.n
            self.n += 1
            for c in self._COLUMNS:
                getattr(self, c).append(None)
        self.prompt[rid], self.pred[rid], self.arrival_s[rid] = prompt, pred, arrival_s
        self.o_base[rid], self.inv_ideal[rid] = 0, inv_ideal
        self.task_id[rid] = 0
        self.prompt_bucket[rid], self.decode_bucket[rid] = prompt_bucket, decode_bucket
        self.ttft_deadline_s[rid] = self.tbt_deadline_s[rid] = math.inf
        self.epoch[rid] = -1
        return rid

    def free(self, rid: int) -> None:
        self._free.append(rid)

    @property
    def live(self) -> int:
        return self.n - len(self._free)


class BackendView:
    """One backend as an engine-like object (the attributes routers read)."""

    def __init__(self, index: int, url: str, table: ServiceTable, *, block_size: int,
                 num_blocks: int, max_seqs: int, latency, stale_s: float):
        self.index, self.url, self.table = index, url, table
        self.bs, self.total_blocks, self.max_seqs = block_size, num_blocks, max_seqs
        self.watermark = max(1, math.ceil(0.01 * num_blocks))
        self.latency = latency
        self.stale_s = stale_s
        self.up = True
        self.inflight: dict[int, None] = {}
        self.unstarted: dict[int, None] = {}
        self.committed_tokens = 0.0
        self.pending_prefill_tokens = 0
        self._decode_left = 0.0
        self._started_tokens = 0
        self.load: BackendLoad | None = None
        self.polled_at = -math.inf
        self.epoch = 0               # bumped by every poll
        self._fresh_unstarted = 0    # unstarted requests sent since the last poll
        self.prefilling: list[int] = []
        self.preempted_q: list[int] = []
        self.wait_left = 0.0          # predicted decode tokens of the unstarted requests
        self.set_buckets(1, 1)

    def set_buckets(self, num_prompt_buckets: int, num_decode_buckets: int) -> None:
        """Size the per-bucket counts a learned policy's observation reads (``table``'s
        ``prompt_bucket`` / ``decode_bucket``, filled by the service when the request comes)."""
        self.prompt_counts = [0] * num_prompt_buckets    # unstarted requests per prompt bucket
        self.decode_counts = [0] * num_decode_buckets    # started requests per decode bucket

    # ------------------------------------------------------------ updates
    def on_route(self, rid: int) -> None:
        tb = self.table
        self.inflight[rid] = None
        self.unstarted[rid] = None
        self.committed_tokens += tb.prompt[rid] + tb.pred[rid]
        self.pending_prefill_tokens += tb.prompt[rid]
        self._decode_left += tb.pred[rid]
        self.wait_left += tb.pred[rid]
        self.prompt_counts[tb.prompt_bucket[rid]] += 1
        tb.epoch[rid] = self.epoch
        self._fresh_unstarted += 1

    def _start(self, rid: int) -> None:
        tb = self.table
        del self.unstarted[rid]
        self.pending_prefill_tokens -= tb.prompt[rid]
        self.wait_left -= tb.pred[rid]
        self.prompt_counts[tb.prompt_bucket[rid]] -= 1
        self.decode_counts[tb.decode_bucket[rid]] += 1
        self._started_tokens += tb.prompt[rid]
        if tb.epoch[rid] == self.epoch:
            self._fresh_unstarted -= 1

    def on_tokens(self, rid: int, n: int) -> None:
        """``n`` more output tokens of ``rid`` streamed back."""
        tb = self.table
        if rid in self.unstarted:
            self._start(rid)
        before = tb.o_base[rid]
        tb.o_base[rid] = before + n
        self._started_tokens += n
        pred = tb.pred[rid]
        self._decode_left -= max(0.0, min(pred, before + n) - min(pred, before))

    def on_end(self, rid: int) -> None:
        tb = self.table
        if rid in self.unstarted:
            self._start(rid)
        del self.inflight[rid]
        self.decode_counts[tb.decode_bucket[rid]] -= 1
        self.committed_tokens -= tb.prompt[rid] + tb.pred[rid]
        self._started_tokens -= tb.prompt[rid] + tb.o_base[rid]
        self._decode_left -= max(0.0, tb.pred[rid] - tb.o_base[rid])
        if not self.inflight:   # drop accumulated rounding
            self.committed_tokens = self._decode_left = self.wait_left = 0.0
            self._started_tokens = self.pending_prefill_tokens = 0

    def on_poll(self, load: BackendLoad, now_s: float) -> None:
        self.load, self.polled_at = load, now_s
        self.epoch += 1
        self._fresh_unstarted = 0
        if load.num_blocks and load.block_size:   # vLLM says how large its KV cache is
            self.total_blocks, self.bs = load.num_blocks, load.block_size
            self.watermark = max(1, math.ceil(0.01 * load.num_blocks))

    # ---------------------------------------------------------- engine-like reads
    def _fresh(self) -> BackendLoad | None:
        load = self.load
        if load is None or time.monotonic() - self.polled_at > self.stale_s:
            return None
        return load

    @property
    def num_requests(self) -> int:
        return len(self.inflight)

    @property
    def num_waiting(self) -> int:
        load = self._fresh()
        if load is None or load.waiting is None:
            return len(self.unstarted)
        return min(len(self.inflight), int(load.waiting) + self._fresh_unstarted)

    @property
    def B(self) -> int:
        return len(self.inflight) - self.num_waiting

    @property
    def waiting_q(self) -> list[int]:
        return list(self.unstarted)

    @property
    def used(self) -> int:
        own = math.ceil(self._started_tokens / self.bs) if self._started_tokens > 0 else 0
        load = self._fresh()
        polled = 0 if load is None or load.kv_usage is None else round(load.kv_usage * self.total_blocks)
        return min(self.total_blocks, max(own, polled))

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used

    def decode_tokens_left(self) -> float:
        return max(0.0, self._decode_left)

    def earliest_completion_s(self) -> float:
        return 0.0   # unknown from outside the server

    def cached_prefix_tokens(self, rid: int) -> int:
        return 0     # the service computes no prompt block hashes (docs/serving.md)

    def observe_into(self, out: list, kv_tokens: float) -> None:
        """The env's per-instance features (``Engine.observe_into``): counts per bucket,
        capacity 1 - committed / KV tokens clipped at -1, earliest completion (0: unknown)."""
        out += self.prompt_counts
        out += self.decode_counts
        cap = 1.0 - self.committed_tokens / kv_tokens
        out.append(cap if cap > -1.0 else -1.0)
        out.append(0.0)

    def idle(self) -> bool:
        return not self.inflight


class _Speeds:
    """``cluster.speeds`` for identical backends (the service does not know their speeds)."""

    homogeneous = True

    def __init__(self, m: int):
        self.token_s = [1.0] * m


class ServiceCluster:
    """``cluster`` as routers read it, over the backends that are up."""

    def __init__(self, views: list[BackendView]):
        self.all = views
        self.table = views[0].table if views else ServiceTable()
        self.queue: deque[int] = deque()
        self.t0 = time.monotonic()
        self.engines: list[BackendView] = []
        self.last_route_s: list[float] = []
        self.speeds = _Speeds(0)
        self.refresh()

    @property
    def t(self) -> float:
        return time.monotonic() - self.t0

    @property
    def n_arrived(self) -> int:
        """Every request the service knows of has arrived (a service has no episode)."""
        return self.table.n

    def refresh(self) -> bool:
        """Rebuild ``engines`` from the backends up; True when membership changed (reset the
        router: its per-episode state counts instances)."""
        up = [v for v in self.all if v.up]
        if up == self.engines:
            return False
        last = {id(v): s for v, s in zip(self.engines, self.last_route_s)}
        self.engines = up
        self.last_route_s = [last.get(id(v), -math.inf) for v in up]
        self.speeds = _Speeds(len(up))
        return True

    def route(self, instance: int, position: int) -> int:
        """Remove the request at ``position`` from the queue and put it in flight on
        ``engines[instance]``; returns its id."""
        rid = self.queue[position]
        del self.queue[position]
        self.engines[instance].on_route(rid)
        self.last_route_s[instance] = self.t
        return rid
