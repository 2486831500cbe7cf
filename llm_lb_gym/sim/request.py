"""Requests of one episode: their static description and lifecycle timestamps.

The table is column-oriented (one Python list per field, indexed by request id) because the
engines touch a few fields of many requests in their hot loops, and Python lists index faster
than numpy arrays for scalar access. ``Request`` is the row view for users.
Ids are positions in the episode's ``RequestBatch``; they belong to this table, never to a
global counter, so two simulations never share state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class Status(IntEnum):
    PENDING = 0   # not yet arrived
    QUEUED = 1    # in the router queue
    WAITING = 2   # in an instance's waiting queue (never run, or preempted)
    PREFILLING = 3  # admitted, prefill chunks in progress (chunked prefill only)
    RUNNING = 4   # decoding
    FINISHED = 5
    REJECTED = 6


REJECT_REASONS = ("exceeds_max_model_len", "exceeds_kv_capacity", "exceeds_max_num_batched_tokens")


def repeated_hash(chain) -> tuple[int, int] | None:
    """(position, id) of the first id that ``chain`` repeats, or None.

    A chain id names the whole prefix up to its block, so one id twice in a chain is corrupt
    data. The engine counts a cached id's blocks once however often it is referenced; a repeat
    inside one request would let that request hold several blocks' worth of prompt in the
    memory of one (an over-subscribed cache that no counter sees), so chains are checked where
    they enter: the trace reader (file and line), ``RequestBatch`` and this table."""
    if chain is None or len(set(chain)) == len(chain):
        return None
    seen: set = set()
    for i, h in enumerate(chain):
        if h in seen:
            return i, h
        seen.add(h)
    return None   # unreachable: a length mismatch means a repeat


def check_hash_chains(chains, source: str) -> None:
    """Raise ValueError naming the first request whose chain repeats an id (``source``: where
    the chains come from, e.g. ``RequestTable.prefix_hashes``)."""
    for rid, chain in enumerate(chains):
        try:
            bad = repeated_hash(chain)
        except TypeError:   # a list or dict among the ids, or a chain that is not a sequence
            raise ValueError(f"{source}[{rid}]={str(chain)[:60]!r} must be a sequence of "
                             "hashable ids (integers) or None") from None
        if bad is not None:
            raise ValueError(
                f"{source}[{rid}] repeats hash id {bad[1]!r} at position {bad[0]}; a prefix hash "
                "chain names each block's whole prefix, so its ids must be distinct")


@dataclass(frozen=True)
class Request:
    """One request's record (a read-only row of the table)."""

    rid: int
    arrival_s: float
    prompt_tokens: int
    decode_tokens: int
    pred_decode_tokens: float
    task_id: int
    status: Status
    instance: int
    routed_s: float
    first_scheduled_s: float
    first_token_s: float
    finish_s: float
    preemptions: int
    reject_reason: str | None


class RequestTable:
    """Column store of one episode's requests (static fields + lifecycle)."""

    def __init__(self, arrival_s, prompt_tokens, decode_tokens, pred_decode_tokens,
                 task_id=None, prompt_bucket=None, decode_bucket=None, inv_ideal_s=None,
                 prefix_hashes=None, hash_block_tokens=0, ttft_deadline_s=None,
                 tbt_deadline_s=None, count_slo=False, pred_upper_tokens=None):
        n = len(arrival_s)
        self.n = n
        # Prefix caching: per request a tuple of chained block hash ids (id i names the prompt's
        # tokens [0, (i+1) * hash_block_tokens)) or None; None for the whole table costs one
        # list of Nones. Read only by engines with enable_prefix_caching.
        if prefix_hashes is not None and len(prefix_hashes) != n:
            raise ValueError(f"prefix_hashes has {len(prefix_hashes)} rows, expected {n}")
        if prefix_hashes is not None:
            check_hash_chains(prefix_hashes, "RequestTable.prefix_hashes")
        self.hashes: list = [None] * n if prefix_hashes is None else list(prefix_hashes)
        self.hash_block_tokens: int = int(hash_block_tokens)
        self.arrival_s: list[float] = [float(x) for x in arrival_s]
        self.prompt: list[int] = [int(x) for x in prompt_tokens]
        self.decode: list[int] = [int(x) for x in decode_tokens]
        self.pred: list[float] = [max(1.0, float(x)) for x in pred_decode_tokens]
        # An upper quantile of each prediction (calibrated predictors; ``predictor/calibration.py``),
        # for routers that hedge on uncertainty; the point prediction where none is stated.
        self.pred_hi: list[float] = (list(self.pred) if pred_upper_tokens is None else
                                     [max(p, float(x)) for p, x in zip(self.pred, pred_upper_tokens)])
        assert len(self.pred_hi) == n, "one upper prediction per request"
        self.task_id: list[int] = [0] * n if task_id is None else [int(x) for x in task_id]
        self.prompt_bucket: list[int] = [0] * n if prompt_bucket is None else [int(x) for x in prompt_bucket]
        self.decode_bucket: list[int] = [0] * n if decode_bucket is None else [int(x) for x in decode_bucket]
        # 1 / (ideal completion time): weight of the reward's in-system penalty (env layer).
        self.inv_ideal: list[float] = [0.0] * n if inv_ideal_s is None else [float(x) for x in inv_ideal_s]
        # Latency SLO deadlines (``sim/slo.py``), set before the episode starts; inf: none.
        self.slo_on = ttft_deadline_s is not None or tbt_deadline_s is not None
        # Engines count completions within both deadlines (``n_slo_met``) only when asked: the
        # env's slo reward needs them as they happen; the metrics recompute them at the end.
        self.count_slo = bool(count_slo) and self.slo_on
        def deadlines(x) -> list[float]:
            return [math.inf] * n if x is None else np.asarray(x, np.float64).tolist()

        self.ttft_deadline_s: list[float] = deadlines(ttft_deadline_s)
        self.tbt_deadline_s: list[float] = deadlines(tbt_deadline_s)
        assert len(self.ttft_deadline_s) == n and len(self.tbt_deadline_s) == n, "one deadline per request"
        nan = math.nan
        self.status: list[int] = [Status.PENDING] * n
        self.instance: list[int] = [-1] * n
        self.routed_s: list[float] = [nan] * n
        self.first_scheduled_s: list[float] = [nan] * n
        self.first_token_s: list[float] = [nan] * n
        self.finish_s: list[float] = [nan] * n
        self.preemptions: list[int] = [0] * n
        self.reject_reason: list[str | None] = [None] * n
        # Engine scratch: generated tokens at decode-iteration counter ``g_base`` of its engine.
        self.o_base: list[int] = [0] * n
        self.g_base: list[int] = [0] * n
        self.admit_seq: list[int] = [-1] * n
        self.prefill_done: list[int] = [0] * n   # tokens of the current prefill already computed
        self.saturated: list[bool] = [False] * n  # generated >= predicted (reward term is 0)
        self.kv_refs: list[int] = [0] * n        # leading hash blocks it holds references on
        self.cached_tokens: list[int] = [0] * n  # prompt tokens reused at its latest admission
        # Instances with a frontend (``sim/frontend.py``) register it here and fill the times
        # the client sees (NaN elsewhere); without one neither list exists.
        self.frontends: list = []
        self.seen_first_token_s: list[float] | None = None
        self.seen_finish_s: list[float] | None = None

    def client_columns(self) -> None:
        """Create the client-side time columns (a frontend's first registration)."""
        if self.seen_first_token_s is None:
            self.seen_first_token_s = [math.nan] * self.n
            self.seen_finish_s = [math.nan] * self.n

    @classmethod
    def from_batch(cls, batch, pred_decode_tokens=None, **columns) -> "RequestTable":
        """The one builder of an episode's table from a request batch (anything with the columns
        of ``workload.batch.RequestBatch``; ``sim.simulate.RequestBatch`` is the protocol).
        Predictions default to the true lengths (oracle); ``columns`` are the optional columns
        of the constructor (buckets, ``inv_ideal_s``, SLO deadlines, ``count_slo``)."""
        pred = batch.decode_tokens if pred_decode_tokens is None else pred_decode_tokens
        if len(pred) != len(batch.arrival_s):
            raise ValueError(f"pred_decode_tokens has {len(pred)} rows, expected "
                             f"{len(batch.arrival_s)} (one per request)")
        return cls(batch.arrival_s, batch.prompt_tokens, batch.decode_tokens, pred, batch.task_id,
                   prefix_hashes=batch.prefix_hashes, hash_block_tokens=batch.hash_block_tokens,
                   **columns)

    def row(self, rid: int) -> Request:
        return Request(rid, self.arrival_s[rid], self.prompt[rid], self.decode[rid], self.pred[rid],
                       self.task_id[rid], Status(self.status[rid]), self.instance[rid],
                       self.routed_s[rid], self.first_scheduled_s[rid], self.first_token_s[rid],
                       self.finish_s[rid], self.preemptions[rid], self.reject_reason[rid])

    def meets_slo(self, rid: int) -> bool:
        """Whether finished request ``rid`` met both deadlines (definitions: ``sim/slo.py``;
        ``slo.slo_met_masks`` is the same test element-wise)."""
        first = self.first_token_s[rid]
        if first - self.arrival_s[rid] > self.ttft_deadline_s[rid]:
            return False
        d = self.decode[rid]
        return d <= 1 or (self.finish_s[rid] - first) / (d - 1) <= self.tbt_deadline_s[rid]

    def column(self, name: str) -> np.ndarray:
        """A field as a numpy array (for metrics)."""
        if name == "status" and self.n:   # Status members: np.asarray inspects each (3x slower)
            return np.fromiter(self.status, np.int64, self.n)
        return np.asarray(getattr(self, name))
