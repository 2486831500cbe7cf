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
count; without metrics it is the unstarted count. The waiting requests (``waiting_q``) are the
last ``num_waiting`` unstarted ones in the order they were sent: a FCFS backend admits the
earliest first. ``B`` (running) is the rest. ``used`` KV blocks is the larger of the polled
usage and the blocks of the started requests' tokens. Non-streamed requests show no tokens
until they end, so for them the polled counts are what splits running from waiting.

One decision, one snapshot. The simulator's clock stands still while a router decides (its
grid), so a round that opens lets a whole batch out. ``ServiceCluster.freeze(t)`` does the same
here: ``t`` is set once per decision (``dispatch.py``) and each backend's polled load is taken
as fresh or stale once, at that time; nothing a router reads moves until the next decision.
With exact inputs (every token and poll as the simulator has them) this view equals the
simulated engine's for FCFS backends without preemption: ``serve/lockstep.py`` drives both and
``tests/test_serve_lockstep.py`` compares every served router's decisions.

``table`` columns are dicts keyed by request id: ids grow with arrivals (routers break ties
to the lower id, i.e. the earlier arrival, as in the simulator's table), and a request's row is
dropped when it ends, so a long-running service holds memory for its live requests only.
"""

from __future__ import annotations

import functools
import math
from collections import deque

from ..sim.iteration_timing import IterationTiming
from ..sim.speed import ideal_s
from ..sim.request import Status
from .scrape import BackendLoad

_QUEUED, _WAITING, _RUNNING = int(Status.QUEUED), int(Status.WAITING), int(Status.RUNNING)


def inv_ideal_function(latency, frontend=None):
    """``(prompt_tokens, max_tokens) -> 1 / ideal latency``, as the env fills ``inv_ideal``
    (``sim.speed.ideal_s``: behind ``frontend`` if the backends' engine has one; late_binding's
    ``shortest`` order and scored_binding's score read it), cached."""

    @functools.lru_cache(maxsize=1 << 16)
    def inv(prompt_tokens: int, max_tokens: int) -> float:
        return float(1.0 / ideal_s(latency, frontend, [prompt_tokens], [float(max_tokens)])[0])

    return inv


class _Constant:
    """A column every row shares (the service computes no block hashes, task ids or SLOs)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __getitem__(self, rid: int):
        return self.value


class ServiceTable:
    """Columns routers read, one entry per live request (``routers/base.py``)."""

    _COLUMNS = ("prompt", "pred", "pred_hi", "arrival_s", "o_base", "inv_ideal", "prompt_bucket",
                "decode_bucket", "epoch", "status")
    hash_block_tokens = 0
    slo_on = False

    def __init__(self):
        self.n = 0               # ids handed out so far (the next id)
        for c in self._COLUMNS:
            setattr(self, c, {})
        self.task_id = _Constant(0)
        self.hashes = _Constant(())
        self.ttft_deadline_s = self.tbt_deadline_s = _Constant(math.inf)

    def add(self, prompt: int, pred: float, arrival_s: float, inv_ideal: float,
            prompt_bucket: int = 0, decode_bucket: int = 0, pred_hi: float | None = None) -> int:
        """``pred_hi``: the upper decode quantile (``RequestTable.pred_hi``, read by scored_binding's
        ``hedge`` and the ``pred_upper`` feature); the service predicts ``max_tokens``, itself a
        bound, so by default the upper prediction is the prediction."""
        rid = self.n
        self.n = rid + 1
        self.prompt[rid], self.pred[rid], self.arrival_s[rid] = prompt, pred, arrival_s
        self.pred_hi[rid] = pred if pred_hi is None else pred_hi
        assert self.pred_hi[rid] >= 0, "an upper prediction is a number of tokens"
        self.o_base[rid], self.inv_ideal[rid] = 0, inv_ideal
        self.prompt_bucket[rid], self.decode_bucket[rid] = prompt_bucket, decode_bucket
        self.epoch[rid] = -1
        self.status[rid] = _QUEUED
        return rid

    def free(self, rid: int) -> None:
        """Drop the row of a request that has ended (idempotent)."""
        if rid in self.prompt:
            for c in self._COLUMNS:
                del getattr(self, c)[rid]

    @property
    def live(self) -> int:
        return len(self.prompt)


class BackendView:
    """One backend as an engine-like object (the attributes routers read)."""

    def __init__(self, index: int, url: str, table: ServiceTable, *, block_size: int,
                 num_blocks: int, max_seqs: int, latency, stale_s: float, async_scheduling: bool = False):
        self.index, self.url, self.table = index, url, table
        self.bs, self.total_blocks, self.max_seqs = block_size, num_blocks, max_seqs
        self.watermark = max(1, math.ceil(0.01 * num_blocks))
        self.latency = latency
        self._timing = None      # IterationTiming of ``latency``, built on first use
        self.async_scheduling = async_scheduling   # the backends' (engine.async_scheduling): the estimate's step time
        self.stale_s = stale_s
        self.up = True
        self.inflight: dict[int, None] = {}
        self.unstarted: dict[int, None] = {}
        self.committed_tokens = 0.0
        self.pending_prefill_tokens = 0
        self._decode_left = 0.0
        self._started_tokens = 0
        self.load: BackendLoad | None = None
        self.polled_at = -math.inf   # service-clock seconds of the last poll
        self._snap: BackendLoad | None = None   # ``load`` if fresh at the last freeze, else None
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
        tb.status[rid] = _WAITING
        self._fresh_unstarted += 1

    def _start(self, rid: int) -> None:
        tb = self.table
        del self.unstarted[rid]
        self.pending_prefill_tokens -= tb.prompt[rid]
        self.wait_left -= tb.pred[rid]
        self.prompt_counts[tb.prompt_bucket[rid]] -= 1
        self.decode_counts[tb.decode_bucket[rid]] += 1
        self._started_tokens += tb.prompt[rid]
        tb.status[rid] = _RUNNING
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
        """A scrape of the backend's metrics at service time ``now_s``."""
        self.load, self.polled_at = load, now_s
        self.epoch += 1
        self._fresh_unstarted = 0
        if load.num_blocks and load.block_size:   # vLLM says how large its KV cache is
            self.total_blocks, self.bs = load.num_blocks, load.block_size
            self.watermark = max(1, math.ceil(0.01 * load.num_blocks))

    def freeze(self, now_s: float) -> None:
        """Take the polled load as fresh or stale for the decision at ``now_s``."""
        load = self.load
        self._snap = load if load is not None and now_s - self.polled_at <= self.stale_s else None

    # ---------------------------------------------------------- engine-like reads
    @property
    def num_requests(self) -> int:
        return len(self.inflight)

    @property
    def num_waiting(self) -> int:
        load = self._snap
        if load is None or load.waiting is None:
            return len(self.unstarted)
        return min(len(self.inflight), int(load.waiting) + self._fresh_unstarted)

    @property
    def B(self) -> int:
        return len(self.inflight) - self.num_waiting

    @property
    def waiting_q(self) -> list[int]:
        w = self.num_waiting
        u = list(self.unstarted)
        return u if w >= len(u) else u[len(u) - w:]

    @property
    def used(self) -> int:
        # A started request holds KV for its prompt and all but its newest token (that one's KV
        # is written by the next iteration): a lower bound of the backend's blocks.
        kv_tokens = self._started_tokens - (len(self.inflight) - len(self.unstarted))
        own = math.ceil(kv_tokens / self.bs) if kv_tokens > 0 else 0
        load = self._snap
        polled = 0 if load is None or load.kv_usage is None else round(load.kv_usage * self.total_blocks)
        return min(self.total_blocks, max(own, polled))

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used

    def decode_tokens_left(self) -> float:
        return max(0.0, self._decode_left)

    def earliest_completion_s(self) -> float:
        """The engine's estimate (``Engine.earliest_completion_s``) from the in-flight table and
        the preset's iteration time: decode iterations until the first started request reaches
        its predicted length, times the current batch's decode iteration (0 when none runs or
        one is past its prediction). What a backend's own scheduler would know better."""
        tb = self.table
        o, pred, prompt = tb.o_base, tb.pred, tb.prompt
        unstarted = self.unstarted
        n, ctx, least = 0, 0, math.inf
        for rid in self.inflight:
            if rid in unstarted:
                continue
            left = pred[rid] - o[rid]
            if left <= 0:
                return 0.0
            n += 1
            ctx += prompt[rid] + o[rid]
            if left < least:
                least = left
        if not n:
            return 0.0
        if self._timing is None:
            self._timing = IterationTiming(self.latency, self.max_seqs, self.async_scheduling)
        return math.ceil(least) * self._timing.decode_s(min(n, self.max_seqs), ctx)

    def cached_prefix_tokens(self, rid: int) -> int:
        return 0     # the service computes no prompt block hashes (docs/serving.md)

    def observe_into(self, out: list, kv_tokens: float) -> None:
        """The env's per-instance features (``Engine.observe_into``): counts per bucket,
        capacity 1 - committed / KV tokens clipped at -1, earliest completion."""
        out += self.prompt_counts
        out += self.decode_counts
        cap = 1.0 - self.committed_tokens / kv_tokens
        out.append(cap if cap > -1.0 else -1.0)
        out.append(self.earliest_completion_s())

    def idle(self) -> bool:
        return not self.inflight


class _Speeds:
    """``cluster.speeds`` for identical backends (the service does not know their speeds)."""

    homogeneous = True

    def __init__(self, m: int):
        self.token_s = [1.0] * m


class ServiceCluster:
    """``cluster`` as routers read it, over the backends that are up. ``t`` is the time of the
    decision being made (``freeze``), in seconds of the service's clock."""

    def __init__(self, views: list[BackendView]):
        self.all = views
        self.table = views[0].table if views else ServiceTable()
        self.queue: deque[int] = deque()
        self.t = 0.0
        self.arrivals_ahead = 0      # what ``table.n - n_arrived`` says (an episode's arrivals left)
        self.engines: list[BackendView] = []
        self.last_route_s: list[float] = []
        self.speeds = _Speeds(0)
        self.refresh()

    @property
    def n_arrived(self) -> int:
        """Every request the service knows of has arrived; a service has no episode, so the
        arrivals still to come are ``arrivals_ahead`` (``learned.py``)."""
        return self.table.n - self.arrivals_ahead

    def freeze(self, t: float) -> None:
        """Start a decision at time ``t``: the clock and every backend's polled load hold still."""
        self.t = t
        for v in self.all:
            v.freeze(t)

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
        ``engines[instance]`` at the decision's time; returns its id."""
        rid = self.queue[position]
        del self.queue[position]
        self.engines[instance].on_route(rid)
        self.last_route_s[instance] = self.t
        return rid
