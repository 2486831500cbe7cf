"""The training distribution of conditions and the fixed held-out suites routers are judged on.

The split (documented in docs/benchmark.md; fixed before any tuning, never moved after):

- **training** (``TRAIN``, what policy search, distillation and RL draw from): the task mix;
  ShareGPT's ``train`` rows (70%, a fixed pseudo-random share); the Azure conversation trace's
  first 70% in time; the corpus's ``train`` prompts (80%, by prompt hash, the predictor's own
  split); loads 0.8-1.5x of capacity; predictor accuracy 0.6-0.95; 2, 4 or 8 V100s or a mixed
  2 A100 + 2 V100 cluster.
- **held out** (``heldout``): arXiv summarization (a workload no training condition uses); the
  *test* rows of ShareGPT, of the Azure trace (its last 30% in time: the future of the part
  trained on) and of the corpus; and the task mix only at combinations the training space does
  not draw: 6 V100s, the A100 / Llama-3.1-8B cluster with chunked prefill, an accuracy of 0.55.
  Seeds from 1000 (training uses 300+, validation 500+).

``check_disjoint`` refuses a suite whose rows overlap the training split (a ``train`` or ``all``
split of a workload that training draws from), so no held-out figure is computed on rows a
router was tuned on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validate import ConfigError, check_int, lookup
from .condition import CLUSTERS, WORKLOADS, Condition


@dataclass(frozen=True)
class ConditionSpace:
    """A distribution over conditions: workloads (with their split) and clusters by weight,
    load and accuracy uniform in ranges."""

    workloads: tuple[tuple[str, str, float], ...]
    """(workload, split, weight)."""
    clusters: tuple[tuple[str, float], ...]
    """(cluster, weight)."""
    load: tuple[float, float] = (0.8, 1.5)
    accuracy: tuple[float, float] = (0.6, 0.95)
    requests_per_instance: int = 300
    """Training episodes are shorter than the held-out suite's (500 per instance): a search plays
    thousands of them on 2 cores, and a router that only works at one episode length is not robust."""

    def __post_init__(self) -> None:
        for w, split, weight in self.workloads:
            Condition(w, split)            # validates the names and the split
            if weight <= 0:
                raise ConfigError(f"condition space: weight of {w}:{split} must be > 0")
        for c, weight in self.clusters:
            if c not in CLUSTERS or weight <= 0:
                raise ConfigError(f"condition space: cluster {c!r} (weight {weight}); allowed: "
                                  f"{', '.join(CLUSTERS)} with weight > 0")

    def sample(self, rng: np.random.Generator, n: int) -> list[Condition]:
        """``n`` conditions drawn from ``rng`` (workload, cluster, load, accuracy)."""
        ww = np.array([w for *_, w in self.workloads], np.float64)
        cw = np.array([w for _, w in self.clusters], np.float64)
        out = []
        for _ in range(n):
            w, split, _ = self.workloads[int(rng.choice(len(ww), p=ww / ww.sum()))]
            c = self.clusters[int(rng.choice(len(cw), p=cw / cw.sum()))][0]
            load = float(np.round(rng.uniform(*self.load), 3))
            acc = float(np.round(rng.uniform(*self.accuracy), 3))
            out.append(Condition(w, split, load, acc, c, self.requests_per_instance))
        return out

    def with_instances(self, m: int, where: str) -> "ConditionSpace":
        """This space on its clusters of ``m`` instances (a learner's spaces are fixed); ``where``
        names the option in the error when there is none."""
        from dataclasses import replace

        from .condition import cluster_size

        clusters = tuple((c, w) for c, w in self.clusters if cluster_size(c) == m)
        if not clusters:
            sizes = sorted({cluster_size(c) for c, _ in self.clusters})
            raise ConfigError(f"{where}: no cluster of the space has num_instances={m}; "
                              f"allowed: {', '.join(map(str, sizes))}")
        return replace(self, clusters=clusters)

    @property
    def mixed(self) -> bool:
        """Whether any cluster it draws is mixed (its observation needs the mixed-cluster features)."""
        return any("instances" in CLUSTERS[c] for c, _ in self.clusters)

    def rows_used(self) -> set[tuple[str, str]]:
        """(workload, split) pairs this space draws rows from."""
        return {(w, s) for w, s, _ in self.workloads}


TRAIN = ConditionSpace(
    workloads=(("task_mix", "all", 0.4), ("sharegpt", "train", 0.2),
               ("azure_conv", "train", 0.2), ("corpus", "train", 0.2)),
    clusters=(("4xV100", 0.4), ("2xV100", 0.2), ("8xV100", 0.2), ("2xA100+2xV100", 0.2)),
)
"""The training distribution (module doc)."""

TRAIN_SYNTHETIC = ConditionSpace(
    workloads=(("task_mix", "all", 1.0),),
    clusters=TRAIN.clusters,
)
"""The training distribution restricted to the task mix: what runs where ``../shared/data`` is
absent (the README's main job on the embedded default)."""

SPACES = {"train": TRAIN, "train_synthetic": TRAIN_SYNTHETIC}
"""The condition spaces by name (``search.conditions``, ``ConditionEnv(space=...)``, the
``LLMCluster-Train-v0`` ids)."""


def get_space(space: "ConditionSpace | str") -> ConditionSpace:
    """A space, or the one ``SPACES`` names (a named error otherwise)."""
    if isinstance(space, ConditionSpace):
        return space
    if space not in SPACES:
        raise ConfigError(f"condition space {space!r} is unknown; allowed: {', '.join(SPACES)}")
    return SPACES[space]


@dataclass(frozen=True)
class Suite:
    """A fixed list of conditions and the seeds every router plays on each."""

    name: str
    conditions: tuple[Condition, ...]
    seeds: int = 5
    first_seed: int = 1000

    def __post_init__(self) -> None:
        if not self.conditions:
            raise ConfigError(f"suite {self.name!r} has no conditions")
        check_int(f"suite {self.name}.seeds", self.seeds, 1)
        check_int(f"suite {self.name}.first_seed", self.first_seed, 0)
        names = [c.name for c in self.conditions]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"suite {self.name!r} lists condition(s) twice: {', '.join(dup)}")

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))


def check_disjoint(suite: Suite, space: ConditionSpace = TRAIN) -> None:
    """Raise when a condition of ``suite`` replays rows that ``space`` trains on."""
    used = space.rows_used()
    for c in suite.conditions:
        if c.workload == "task_mix":
            continue                       # a generator: no rows, nothing to leak
        for w, s in used:
            if w == c.workload and (s == "all" or c.split == "all" or s == c.split):
                allowed = "split='test'" if s == "train" else "none (training uses all its rows)"
                raise ConfigError(f"suite {suite.name!r}: condition {c.name!r} replays rows that "
                                  f"training draws ({w}:{s}); allowed for {w}: {allowed}")


_V = "4xV100"
HELDOUT = Suite("heldout", (
    Condition("task_mix", load=1.0, accuracy=0.79, cluster="6xV100"),
    Condition("task_mix", load=1.4, accuracy=0.55, cluster=_V),
    Condition("task_mix", load=1.2, accuracy=0.79, cluster="4xA100-llama3-chunked"),
    Condition("sharegpt", "test", load=1.0, accuracy=0.79, cluster=_V),
    Condition("sharegpt", "test", load=1.4, accuracy=0.7, cluster="2xA100+2xV100"),
    Condition("arxiv", load=1.0, accuracy=0.79, cluster=_V),
    Condition("arxiv", load=1.3, accuracy=0.65, cluster="8xV100"),
    Condition("azure_conv", "test", load=1.0, accuracy=0.79, cluster=_V),
    Condition("azure_conv", "test", load=1.4, accuracy=0.79, cluster="6xV100"),
    Condition("corpus", "test", load=1.2, accuracy=0.79, cluster=_V),
    Condition("corpus", "test", load=1.5, accuracy=0.9, cluster="2xV100"),
), seeds=5)
"""The held-out suite (module doc): 11 conditions x 5 seeds."""

SYNTHETIC = Suite("synthetic", tuple(c for c in HELDOUT.conditions if c.workload == "task_mix"),
                  seeds=5)
"""The held-out suite's task-mix conditions: runs without ``../shared/data``."""

SMOKE = Suite("smoke", (
    Condition("task_mix", load=1.3, accuracy=0.79, cluster="2xV100", requests_per_instance=100),
    Condition("task_mix", load=1.0, accuracy=0.6, cluster="4xV100", requests_per_instance=100),
), seeds=2)
"""Two tiny task-mix conditions: tests and a first look (seconds)."""

ACCURACIES = (0.5, 0.6, 0.7, 0.79, 0.9, 1.0, None)
ACCURACY = Suite("accuracy", tuple(
    Condition(w, split, load=1.4, accuracy=a, cluster=_V)
    for w, split in (("task_mix", "all"), ("corpus", "test")) for a in ACCURACIES), seeds=5)
"""How routers degrade as predictor accuracy falls (0.5-1.0, and the oracle as the clairvoyant
reference): the task mix (inside the training distribution's workloads) and the corpus's
held-out prompts, at 1.4x on 4 V100s. A characterisation, not a held-out result."""

SUITES: dict[str, Suite] = {s.name: s for s in (HELDOUT, SYNTHETIC, SMOKE, ACCURACY)}


def get_suite(name: str) -> Suite:
    return lookup("suite", SUITES, name)


for _s in SUITES.values():
    check_disjoint(_s)
assert set(WORKLOADS) >= {c.workload for s in SUITES.values() for c in s.conditions}
