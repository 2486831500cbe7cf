"""A condition: one deployment a router may meet (traffic, load, predictor, cluster).

A router tuned on one synthetic world with perfect predictions (package 0.6.0's) can fail the
first real one. So routers are trained over a *distribution* of conditions and judged on a
fixed suite of conditions they never saw (``suite/suites.py``). A condition names:

- ``workload``: one of ``WORKLOADS`` (the paper's task mix, real traces, a text corpus), and
  ``split``: which of its rows (``"all"``, ``"train"``, ``"test"``; ``TraceWorkload.split`` and
  ``CorpusWorkload.split``, fixed by the file, so training never sees a test row);
- ``load``: offered rate as a multiple of the cluster's *measured* capacity for that workload
  (``least_requests``' completions per second with every instance saturated,
  ``capacity.capacity_rps``: on identical instances the same as round robin's; on a mixed
  cluster it splits by speed where round robin is held to the slowest instance's pace: 50.3
  vs 38.7 req/s on 2 A100 + 2 V100), so "1.2" means the same stress on a V100 cluster and on
  a mixed one. Timestamped traces keep
  their burstiness and are replayed faster or slower (``rate_scale``) to reach the load on average;
- ``accuracy``: the deployable predictor's accuracy (the calibrated noisy predictor of
  ``predictor.registry.DEFAULT_PREDICTOR`` at that accuracy), or None for the oracle, which is
  only ever a labelled clairvoyant reference;
- ``cluster``: one of ``CLUSTERS`` (size and hardware, mixed clusters included).

``env_kwargs()`` turns it into ``gym.make("LLMCluster-v0", **kw)`` keywords; episodes scale with
the cluster (``requests_per_instance``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .._validate import ConfigError, check_choice, check_int, check_range
from ..predictor.registry import DEFAULT_PREDICTOR

CAPACITY_ROUTER = "least_requests"
"""Whose saturated throughput a load factor divides by (module doc)."""

CONTEXT_CAP_TOKENS = 4096
"""Rows whose prompt fills Llama-2's 4,096-token window are dropped and outputs clipped to it
(the smallest window of the clusters below), as the paper filters its prompts."""

WORKLOADS: dict[str, dict] = {
    "task_mix": {"name": "task_mix"},
    "sharegpt": {"name": "sharegpt", "max_context_tokens": CONTEXT_CAP_TOKENS},
    "arxiv": {"name": "arxiv_summarization", "max_context_tokens": CONTEXT_CAP_TOKENS},
    "azure_conv": {"name": "azure_conv", "max_context_tokens": CONTEXT_CAP_TOKENS},
    "corpus": {"name": "corpus", "max_prompt_tokens": 1000, "max_context_tokens": CONTEXT_CAP_TOKENS},
}
"""Workloads of the conditions: the five-task mix (synthetic, the paper's), ShareGPT and arXiv
summarization lengths (real lengths, Poisson arrivals), the Azure conversation trace (real
lengths and real bursty arrivals) and the prompts-with-responses corpus (real prompts and
responses of 11 task types). The last four need ``../shared/data`` (``data.locate``)."""
SPLITTABLE = ("sharegpt", "arxiv", "azure_conv", "corpus")
"""Workloads with rows to hold out (the task mix is a generator: it has none)."""

CLUSTERS: dict[str, dict] = {
    "2xV100": {"num_instances": 2, "engine": {"preset": "llama2-7b-v100"}},
    "4xV100": {"num_instances": 4, "engine": {"preset": "llama2-7b-v100"}},
    "6xV100": {"num_instances": 6, "engine": {"preset": "llama2-7b-v100"}},
    "8xV100": {"num_instances": 8, "engine": {"preset": "llama2-7b-v100"}},
    "2xA100+2xV100": {"instances": [{"preset": "llama2-7b-a100", "count": 2},
                                    {"preset": "llama2-7b-v100", "count": 2}]},
    "4xA100-llama3-chunked": {"num_instances": 4, "engine": {
        "preset": "llama3-8b-a100", "chunked_prefill": True, "max_num_batched_tokens": 1024}},
}
"""Cluster shapes: the paper's V100 instances at 2-8, a mixed A100 + V100 cluster, and the
paper's A100 / Llama-3.1-8B setting with chunked prefill (1,024 batched tokens)."""


def cluster_size(cluster: str) -> int:
    spec = CLUSTERS[cluster]
    return spec.get("num_instances") or sum(g["count"] for g in spec["instances"])


@dataclass(frozen=True)
class Condition:
    """One deployment (module doc)."""

    workload: str
    split: str = "all"
    load: float = 1.2
    accuracy: float | None = 0.79
    cluster: str = "4xV100"
    requests_per_instance: int = 500

    def __post_init__(self) -> None:
        check_choice("condition.workload", self.workload, tuple(WORKLOADS))
        check_choice("condition.split", self.split, ("all", "train", "test"))
        if self.split != "all" and self.workload not in SPLITTABLE:
            raise ConfigError(f"condition.split={self.split!r}: workload {self.workload!r} has no "
                              f"rows to split; allowed: split='all' (splittable: {', '.join(SPLITTABLE)})")
        check_range("condition.load", self.load, 0.05, 10.0)
        if self.accuracy is not None:
            check_range("condition.accuracy", self.accuracy, 0.0, 1.0, lo_open=True)
        check_choice("condition.cluster", self.cluster, tuple(CLUSTERS))
        check_int("condition.requests_per_instance", self.requests_per_instance, 10, 100_000)

    @property
    def name(self) -> str:
        """E.g. ``sharegpt:test 1.2x acc0.79 4xV100`` (``oracle`` for the clairvoyant one)."""
        w = self.workload if self.split == "all" else f"{self.workload}:{self.split}"
        acc = "oracle" if self.accuracy is None else f"acc{self.accuracy:g}"
        return f"{w} {self.load:g}x {acc} {self.cluster}"

    @property
    def num_requests(self) -> int:
        return self.requests_per_instance * cluster_size(self.cluster)

    def workload_options(self) -> dict:
        spec = dict(WORKLOADS[self.workload])
        if self.split != "all":
            spec["split"] = self.split
        return spec

    def predictor(self):
        if self.accuracy is None:
            return "oracle"
        return {**DEFAULT_PREDICTOR, "accuracy": float(self.accuracy)}

    def base_kwargs(self) -> dict:
        """The env keywords without the arrival rate (what capacity is measured on)."""
        return {**CLUSTERS[self.cluster], "workload": self.workload_options(),
                "num_requests": self.num_requests, "predictor": self.predictor(),
                "reward": {"mode": "baseline"}}

    def env_kwargs(self) -> dict:
        """``gym.make`` keywords: ``base_kwargs`` at ``load`` x the measured capacity."""
        kw = self.base_kwargs()
        cap = measured_capacity_rps(self.workload, self.split, self.cluster, self.num_requests)
        rate = self.load * cap
        native = native_rate_rps(self.workload, self.split)
        if native is None:
            kw["arrival_rate_rps"] = rate
        else:   # a timestamped trace: replay it faster or slower, keep its bursts
            kw["arrival_rate_rps"] = None
            kw["workload"] = {**kw["workload"], "rate_scale": rate / native}
        return kw


def missing_data(cond: Condition) -> str | None:
    """Why ``cond`` cannot run here (its dataset is not found), or None."""
    from ..data.store import DataNotFoundError
    from ..workload.registry import make_workload

    spec = cond.workload_options()
    try:
        make_workload(spec.pop("name"), **spec)
    except DataNotFoundError as e:
        return str(e).splitlines()[0]
    return None


@lru_cache(maxsize=None)
def measured_capacity_rps(workload: str, split: str, cluster: str, num_requests: int) -> float:
    """least_requests' saturated throughput on the cluster for the workload (it reads no
    predictions; seed 0), cached per process."""
    from ..capacity import capacity_rps

    c = Condition(workload, split, cluster=cluster)
    kw = {**c.base_kwargs(), "num_requests": num_requests, "predictor": "oracle"}
    return capacity_rps(kw, seed=0, router=CAPACITY_ROUTER)


@lru_cache(maxsize=None)
def native_rate_rps(workload: str, split: str) -> float | None:
    """Mean arrival rate of a timestamped trace's rows (None: synthetic arrivals)."""
    from ..workload.registry import make_workload, uses_synthetic_arrivals

    spec = Condition(workload, split).workload_options()
    name = spec.pop("name")
    if uses_synthetic_arrivals(name, spec):
        return None
    return make_workload(name, **spec).mean_rate_rps
