"""The router's observation: router queue, candidate requests, and per-instance state.

Flat layout (``ObsConfig.as_dict=False``): a global block, then k candidate blocks (k = the
action's ``candidates``; 1 = the router-queue head, the paper's), then m instance blocks. With
n_p prompt and n_d decode buckets and no extra features it is the paper's 4 + m (n_p + n_d + 2):

| index | feature | raw unit | normalised by |
|---|---|---|---|
| 0 | router queue length, capped at ``queue_cap`` | requests | queue_cap |
| (extra) | ``arrivals_left``: requests of the episode still to arrive | requests | num_requests |
| candidate j: | prompt tokens (0 if there is no such candidate) | tokens | context length |
| | predicted decode bucket | bucket index | n_d - 1 |
| | predicted decode tokens | tokens | context length |
| | (extra) ``age``: time waited at the router | s | time_scale_s |
| | (extra) ``block_need``: KV blocks of prompt + predicted decode | blocks | KV blocks |
| | (extra) ``pred_upper``: the predictor's upper quantile of its decode (calibrated predictors: 0.9; else the prediction) | tokens | context length |
| instance i: | P[i, b]: requests in prompt phase (waiting or prefilling), prompt bucket b | requests | max_num_seqs |
| | D[i, b]: requests in decode phase, predicted decode bucket b | requests | max_num_seqs |
| | capacity C[i] = 1 - committed tokens / KV-cache tokens, clipped to [-1, 1] | share | - |
| | predicted time until instance i's first running request completes | s | time_scale_s |
| | (extra) ``free_kv_blocks`` | blocks | KV blocks |
| | (extra) ``waiting_blocks``: KV its waiting requests will need (prompt + predicted decode) | blocks | KV blocks |
| | (extra) ``time_since_route``: since the router last sent a request there | s | time_scale_s |
| | (extra) ``cached_prefix``: prompt tokens of the head request cached on the instance (0 without ``engine.enable_prefix_caching``) | tokens | context length |
| | (extra) ``speed``: relative speed, fastest instance's reference time / this one's (``sim/speed.py``) | share in (0, 1] | - |
| | (extra) ``kv_size``: the instance's KV-cache size | tokens | largest instance's KV tokens |

Mixed clusters (``EnvConfig.instances``): each instance's counts are normalised by its own
``max_num_seqs``, its capacity and block features by its own KV cache (so 0.5 means "half of
this instance's cache"); ``speed`` and ``kv_size`` tell the instances apart, so the env turns
them on in every mixed cluster (appended to ``obs.features`` when not listed). A candidate's
``block_need`` is in blocks of the instance with the largest KV cache, normalised by its blocks.
In a homogeneous cluster all of this is the single instance type's value, as before.

"Committed tokens" = prompt + predicted decode tokens of every request routed to the instance
and not finished: the KV the instance will need if nothing finishes, which is why it is the
capacity signal (it changes only at routing and completion events, so it costs nothing per step).

The space depends only on what changes an observation's meaning (instances, buckets, features,
normalisation, queue cap, context length), never on ``num_requests``: a bucket count is bounded
by ``limits.MAX_REQUESTS`` (the longest episode allowed) and a normalised ``arrivals_left`` by 1,
so a model trained on 500-request episodes loads and acts on 2,000-request ones, and a vector
env may mix episode lengths. (The values are the same as before these bounds; only the bounds
changed.)

The block structure (``ObsLayout``) is what permutation-equivariant networks read: every
instance block has the same features in the same order, and so has every candidate block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from gymnasium import spaces

from ..limits import MAX_REQUESTS
from ..predictor.buckets import BucketScheme
from ._kernels import kernels_for
from .config import ObsConfig

GLOBAL_FEATURES = ("arrivals_left",)
CANDIDATE_FEATURES = ("age", "block_need", "pred_upper")
INSTANCE_FEATURES = ("free_kv_blocks", "waiting_blocks", "time_since_route", "cached_prefix", "speed",
                     "kv_size")
MIXED_CLUSTER_FEATURES = ("speed", "kv_size")
"""Always on in a mixed cluster (appended to ``ObsConfig.features`` when not listed)."""
FEATURES = GLOBAL_FEATURES + CANDIDATE_FEATURES + INSTANCE_FEATURES
"""Extra features ``ObsConfig.features`` may list (beyond the paper's)."""
_BIG = np.float32(1e6)

NORMALIZERS = ("none", "max_num_seqs", "kv_blocks", "context_len", "time_scale_s")
"""What an :class:`InstanceFeature` is divided by with ``obs.normalize`` (per instance where the
instance has its own: its ``max_num_seqs``, its KV blocks)."""


@dataclass(frozen=True)
class InstanceFeature:
    """A per-instance feature added without editing the builder (README, "How to extend").

    Why a table entry and not a flag like the built-in ones: a feature of one's own then touches
    one file (where it is defined and registered), and its column lands in every instance block,
    so ``env.obs_layout`` and the permutation-equivariant networks pick it up unchanged. It is
    computed after the built-in features, in the order ``obs.features`` lists it; the env pays
    for it only when ``obs.features`` names it.
    """

    name: str
    """The ``obs.features`` entry (and the key in a ``Dict`` observation)."""
    value: Callable[[Any, int], float]
    """``value(cluster, i)``: the raw value for instance ``i`` (read only what a router may read:
    ``routers/base.py``)."""
    high: float
    """Upper bound of the raw value (the observation space's bound)."""
    normalize_by: str = "none"
    """With ``obs.normalize``, the value is divided by this (a name of ``NORMALIZERS``)."""
    low: float = 0.0
    """Lower bound of the raw value."""

    def __post_init__(self) -> None:
        if not self.name or self.name in FEATURES:
            raise ValueError(f"InstanceFeature name {self.name!r} is empty or built in; built in: "
                             f"{', '.join(FEATURES)}")
        if self.normalize_by not in NORMALIZERS:
            raise ValueError(f"InstanceFeature {self.name}: normalize_by={self.normalize_by!r}; "
                             f"allowed: {', '.join(NORMALIZERS)}")
        if not callable(self.value):
            raise TypeError(f"InstanceFeature {self.name}: value must be callable (cluster, i) -> float")
        if not float(self.low) < float(self.high):
            raise ValueError(f"InstanceFeature {self.name}: low={self.low} must be below high={self.high}")


INSTANCE_FEATURE_TABLE: dict[str, InstanceFeature] = {}
"""Per-instance features registered with :func:`register_instance_feature`."""


def register_instance_feature(feature: InstanceFeature) -> InstanceFeature:
    """Make ``feature.name`` a valid ``obs.features`` entry (in this process: register it before
    ``gym.make``, also in vector-env workers). A name may be registered once."""
    if INSTANCE_FEATURE_TABLE.get(feature.name, feature) != feature:
        raise ValueError(f"observation feature {feature.name!r} is already registered")
    INSTANCE_FEATURE_TABLE[feature.name] = feature
    return feature


def feature_names() -> tuple[str, ...]:
    """Every name ``obs.features`` accepts: the built-in ones, then the registered ones."""
    return FEATURES + tuple(INSTANCE_FEATURE_TABLE)


@dataclass(frozen=True)
class ObsLayout:
    """Sizes of the flat observation's blocks: ``global_dim`` features, then
    ``num_candidates`` blocks of ``candidate_dim``, then ``num_instances`` blocks of
    ``instance_dim``. Actions: ``j * num_instances + i`` routes candidate j to instance i, the
    last action defers."""

    global_dim: int
    num_candidates: int
    candidate_dim: int
    num_instances: int
    instance_dim: int

    @property
    def size(self) -> int:
        return self.global_dim + self.num_candidates * self.candidate_dim + self.num_instances * self.instance_dim

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("global_dim", "num_candidates", "candidate_dim",
                                              "num_instances", "instance_dim")}


def _per_instance(name: str, value, m: int) -> list:
    """A scalar for every instance, or one value per instance."""
    if hasattr(value, "__len__"):
        if len(value) != m:
            raise ValueError(f"ObservationBuilder: {name} has {len(value)} values for {m} instances")
        return list(value)
    return [value] * m


class ObservationBuilder:
    """``max_num_seqs``, ``kv_tokens``, ``block_size`` and ``relative_speed`` are one value for
    every instance or a sequence with one per instance (a mixed cluster)."""

    def __init__(self, cfg: ObsConfig, num_instances: int, num_requests: int, max_num_seqs,
                 context_len: int, kv_tokens, *, num_candidates: int = 1, block_size=16,
                 relative_speed=1.0):
        self.cfg = cfg
        self.m = num_instances
        m = num_instances
        seqs = _per_instance("max_num_seqs", max_num_seqs, m)
        kv_list = [float(x) for x in _per_instance("kv_tokens", kv_tokens, m)]
        bs_list = _per_instance("block_size", block_size, m)
        self.speed = [float(x) for x in _per_instance("relative_speed", relative_speed, m)]
        self.k = num_candidates
        self.num_requests = num_requests
        self.prompt_scheme = BucketScheme(cfg.prompt_edges_tokens, name="obs_prompt")
        self.decode_scheme = BucketScheme(cfg.decode_edges_tokens, name="obs_decode")
        self.n_p, self.n_d = self.prompt_scheme.num_buckets, self.decode_scheme.num_buckets
        feats = set(cfg.features)
        self.f_arrivals = "arrivals_left" in feats
        self.f_age = "age" in feats
        self.f_need = "block_need" in feats
        self.f_upper = "pred_upper" in feats
        self.f_free = "free_kv_blocks" in feats
        self.f_wait = "waiting_blocks" in feats
        self.f_since = "time_since_route" in feats
        self.f_prefix = "cached_prefix" in feats
        self.f_speed = "speed" in feats
        self.f_kv = "kv_size" in feats
        self.custom = tuple(INSTANCE_FEATURE_TABLE[f] for f in cfg.features if f in INSTANCE_FEATURE_TABLE)
        # Candidates' block need: in blocks of the instance with the largest KV cache.
        big = max(range(m), key=lambda i: kv_list[i])
        self.block_size = bs_list[big]
        self.kv_blocks = int(kv_list[big]) // self.block_size
        self.kv_tokens_list = kv_list
        self.inst_block_size = bs_list
        self.layout = ObsLayout(1 + self.f_arrivals, self.k, 3 + self.f_age + self.f_need + self.f_upper, self.m,
                                self.n_p + self.n_d + 2 + self.f_free + self.f_wait + self.f_since
                                + self.f_prefix + self.f_speed + self.f_kv + len(self.custom))
        self.per = self.layout.instance_dim
        self.size = self.layout.size
        self._cand0 = self.layout.global_dim
        self._inst0 = self._cand0 + self.k * self.layout.candidate_dim
        norm = cfg.normalize
        s_queue = 1.0 / cfg.queue_cap if norm else 1.0
        s_tok = 1.0 / context_len if norm else 1.0
        s_bucket = 1.0 / max(self.n_d - 1, 1) if norm else 1.0
        s_time = 1.0 / cfg.time_scale_s if norm else 1.0
        s_blocks = 1.0 / max(self.kv_blocks, 1) if norm else 1.0
        kv_max = max(kv_list)
        s_req = 1.0 / num_requests if norm else 1.0
        self.round = cfg.round_decimals
        self._queue_cap = cfg.queue_cap
        self._cand_extras = self.f_age or self.f_need or self.f_upper
        self._inst_extras = bool(self.f_free or self.f_wait or self.f_since or self.f_prefix
                                 or self.f_speed or self.f_kv or self.custom)
        self._no_candidate = (0,) * self.layout.candidate_dim
        # The paper's global and candidate blocks (queue length, one head request): filled in
        # one list display by observe. One KV size for all instances: passed as is.
        self._paper_head = self.k == 1 and not (self.f_arrivals or self._cand_extras)
        self._kv_all = kv_list[0] if len(set(kv_list)) == 1 else None
        # The compiled kernel fills the layouts without extras (see ``observer``).
        self._kernel_layout = not (self._cand_extras or self._inst_extras or cfg.as_dict
                                   or self.round is not None)
        self._flat = None
        lo, hi, scale = [], [], []

        def add(low, high, sc):
            lo.append(low)
            hi.append(high * sc)
            scale.append(sc)

        add(0.0, cfg.queue_cap, s_queue)
        free = []   # positions whose bound depended on num_requests before issue 22
        if self.f_arrivals:   # normalised: the share of the episode still to arrive
            free.append(len(lo))
            lo.append(0.0)
            hi.append(1.0 if norm else float(MAX_REQUESTS))
            scale.append(s_req)
        for _ in range(self.k):
            add(0.0, context_len * 4, s_tok)      # predicted tokens may exceed the context
            add(0.0, self.n_d - 1, s_bucket)
            add(0.0, context_len * 4, s_tok)
            if self.f_age:
                add(0.0, _BIG, s_time)
            if self.f_need:
                add(0.0, context_len * 4 / self.block_size + 1, s_blocks)
            if self.f_upper:
                add(0.0, context_len * 4, s_tok)
        self._round_idx = []
        for i in range(self.m):
            s_count = 1.0 / seqs[i] if norm else 1.0
            blocks_i = int(kv_list[i]) // bs_list[i]
            s_blocks_i = 1.0 / max(blocks_i, 1) if norm else 1.0
            for _ in range(self.n_p + self.n_d):   # any episode length: see the module docstring
                free.append(len(lo))
                add(0.0, MAX_REQUESTS, s_count)
            self._round_idx += [len(lo), len(lo) + 1]
            lo.append(-1.0)
            hi.append(1.0)
            scale.append(1.0)
            add(0.0, _BIG, s_time)
            if self.f_free:
                add(0.0, blocks_i, s_blocks_i)
            if self.f_wait:
                add(0.0, _BIG, s_blocks_i)
            if self.f_since:
                add(0.0, _BIG, s_time)
            if self.f_prefix:
                add(0.0, context_len, s_tok)
            if self.f_speed:
                add(0.0, 1.0, 1.0)
            if self.f_kv:
                add(0.0, kv_max, 1.0 / kv_max if norm else 1.0)
            for feat in self.custom:
                sc = 1.0
                if norm and feat.normalize_by != "none":
                    sc = {"max_num_seqs": s_count, "kv_blocks": s_blocks_i, "context_len": s_tok,
                          "time_scale_s": s_time}[feat.normalize_by]
                lo.append(float(feat.low) * sc)
                hi.append(float(feat.high) * sc)
                scale.append(sc)
        self.low = np.array(lo, np.float32)
        self.high = np.array(hi, np.float32)
        self.scale = np.array(scale, np.float32)
        assert len(self.low) == self.size
        self.episode_free_bounds = np.zeros(self.size, bool)
        """True where the upper bound was ``num_requests``-derived in earlier versions (bucket
        counts, ``arrivals_left``): ``llm_lb_gym.agents.factory.load_agent`` loads models saved then."""
        self.episode_free_bounds[free] = True
        self.box = spaces.Box(self.low, self.high, dtype=np.float32)

    def space(self) -> spaces.Space:
        if not self.cfg.as_dict:
            return self.box
        m, n_p, n_d, per = self.m, self.n_p, self.n_d, self.per
        inst_lo = self.low[self._inst0:].reshape(m, per)
        inst_hi = self.high[self._inst0:].reshape(m, per)
        d = {
            "queue": spaces.Box(self.low[:self._inst0], self.high[:self._inst0], dtype=np.float32),
            "prompt_counts": spaces.Box(inst_lo[:, :n_p], inst_hi[:, :n_p], dtype=np.float32),
            "decode_counts": spaces.Box(inst_lo[:, n_p:n_p + n_d], inst_hi[:, n_p:n_p + n_d], dtype=np.float32),
            "capacity": spaces.Box(-1.0, 1.0, (m,), dtype=np.float32),
            "earliest_completion": spaces.Box(0.0, float(inst_hi[0, n_p + n_d + 1]), (m,), dtype=np.float32),
        }
        for j, name in enumerate(self._instance_extras()):
            col = n_p + n_d + 2 + j
            d[name] = spaces.Box(inst_lo[:, col], inst_hi[:, col], dtype=np.float32)
        return spaces.Dict(d)

    def _instance_extras(self) -> list[str]:
        return [f for f, on in (("free_kv_blocks", self.f_free), ("waiting_blocks", self.f_wait),
                                ("time_since_route", self.f_since),
                                ("cached_prefix", self.f_prefix), ("speed", self.f_speed),
                                ("kv_size", self.f_kv)) if on] + [f.name for f in self.custom]

    def observe(self, cluster, candidates=None):
        """Build the observation from the cluster's O(1) aggregates. ``candidates``: the request
        ids of the candidate slots (default: the router-queue head).

        The env calls this once per step: the paper's blocks are filled without a feature test
        per value, the extra features in their own helpers. The array is new every time
        (Gymnasium's checker warns when two steps' observations share memory; buffers keep them)."""
        tb = cluster.table
        q = cluster.queue
        if candidates is None:
            candidates = (q[0],) if q else ()
        if self._paper_head:   # prompt tokens, predicted decode bucket, predicted decode tokens
            if candidates:
                r = candidates[0]
                vals = [min(len(q), self._queue_cap), tb.prompt[r], tb.decode_bucket[r], tb.pred[r]]
            else:
                vals = [min(len(q), self._queue_cap), 0, 0, 0]
        else:
            vals = [min(len(q), self._queue_cap)]
            if self.f_arrivals:
                vals.append(tb.n - cluster.n_arrived)
            self._candidates_into(vals, cluster, candidates)
        if self._inst_extras:
            self._instances_into(vals, cluster)
        elif self._kv_all is not None:
            kv = self._kv_all
            for e in cluster.engines:
                e.observe_into(vals, kv)
        else:
            for e, kv in zip(cluster.engines, self.kv_tokens_list):
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

    def observer(self, cluster):
        """What the env calls for each observation of ``cluster``'s episode, as
        ``f(cluster, candidates)`` with a tuple of candidates: ``step_kernels.FlatObservation``'s
        ``observe`` (the same array, filled in C) when the compiled kernels are built and
        ``cluster`` runs the compiled engine and the layout has no extra feature, rounding or
        dict; else ``observe``, the reference."""
        if self._kernel_layout:
            kernels = kernels_for(cluster.engines)
            if kernels is not None:
                if self._flat is None:
                    self._flat = kernels.FlatObservation(
                        self.scale, self.kv_tokens_list, self.k, self.n_p, self.n_d,
                        self._queue_cap, self.f_arrivals)
                return self._flat.observe
        return self.observe

    def _candidates_into(self, vals: list, cluster, candidates) -> None:
        """The k candidate blocks, with ``age`` and ``block_need`` when on (0s for an empty slot)."""
        tb = cluster.table
        t = cluster.t
        bs = self.block_size
        if not self._cand_extras:
            n = len(candidates)
            for j in range(n if n < self.k else self.k):
                r = candidates[j]
                vals += (tb.prompt[r], tb.decode_bucket[r], tb.pred[r])
            if n < self.k:
                vals += self._no_candidate * (self.k - n)
            return
        for j in range(self.k):
            if j < len(candidates):
                r = candidates[j]
                vals += (tb.prompt[r], tb.decode_bucket[r], tb.pred[r])
                if self.f_age:
                    vals.append(t - tb.arrival_s[r])
                if self.f_need:
                    vals.append(-(-(tb.prompt[r] + tb.pred[r]) // bs))
                if self.f_upper:
                    vals.append(tb.pred_hi[r])
            else:
                vals += self._no_candidate

    def _instances_into(self, vals: list, cluster) -> None:
        """Instance blocks with extra features."""
        q = cluster.queue
        t = cluster.t
        kv = self.kv_tokens_list
        for i, e in enumerate(cluster.engines):
            e.observe_into(vals, kv[i])
            if self.f_free:
                vals.append(e.free_blocks)
            if self.f_wait:   # O(1) aggregates: prompt (+ generated) + predicted decode left
                vals.append((e.pending_prefill_tokens + e.wait_left) / self.inst_block_size[i])
            if self.f_since:   # since the last route there, or since the episode began
                last = cluster.last_route_s[i]
                vals.append(t - last if last > 0.0 else t)
            if self.f_prefix:   # the engine's own lookup (what a cache-aware gateway asks)
                vals.append(e.cached_prefix_tokens(q[0]) if q else 0)
            if self.f_speed:
                vals.append(self.speed[i])
            if self.f_kv:
                vals.append(kv[i])
            for feat in self.custom:
                vals.append(feat.value(cluster, i))

    def to_dict(self, flat: np.ndarray) -> dict:
        m, n_p, n_d, per = self.m, self.n_p, self.n_d, self.per
        inst = flat[self._inst0:].reshape(m, per)
        d = {
            "queue": flat[:self._inst0].copy(),
            "prompt_counts": inst[:, :n_p].copy(),
            "decode_counts": inst[:, n_p:n_p + n_d].copy(),
            "capacity": inst[:, n_p + n_d].copy(),
            "earliest_completion": inst[:, n_p + n_d + 1].copy(),
        }
        for j, name in enumerate(self._instance_extras()):
            d[name] = inst[:, n_p + n_d + 2 + j].copy()
        return d
