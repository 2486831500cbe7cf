"""Mixing-greedy: the instance where the paper's mixing estimator predicts the least harm.

The analytic estimator of §5.2 (``routers/mixing.py``) scores placing request i on instance l from
i's prompt and predicted decode and l's committed tokens: a prompt term that penalises long
prefills landing on busy instances, and a decode term that grows with the tokens already there.
The workload-guided reward's heuristic term measures the agent against exactly this choice, so
this router is the "teacher" the guided agent starts from; as a baseline it shows what the
estimator alone achieves.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validate import check_range
from .base import RouterBase, argmax
from .mixing import MixingParams, cluster_mixing_scores

_DEFAULT = MixingParams()


@dataclass(frozen=True)
class MixingGreedyOptions:
    """The estimator's parameters (defaults: ``MixingParams``, the paper's V100 gradients)."""

    grad1: float = _DEFAULT.grad1
    """Seconds per prompt token."""
    grad2: float = _DEFAULT.grad2
    """Decode-time gradient per token in the instance."""
    eps_s: float = _DEFAULT.eps_s
    """Prompt-impact threshold: no prompt penalty below it."""
    alpha: float = _DEFAULT.alpha
    """Weight of the prompt term against the decode term."""

    def __post_init__(self) -> None:
        check_range("router.mixing_greedy.grad1", self.grad1, 0.0)
        check_range("router.mixing_greedy.grad2", self.grad2, 0.0)
        check_range("router.mixing_greedy.eps_s", self.eps_s, 0.0, lo_open=True)
        check_range("router.mixing_greedy.alpha", self.alpha, 0.0, 1.0)

    @property
    def params(self) -> MixingParams:
        return MixingParams(grad1=self.grad1, grad2=self.grad2, eps_s=self.eps_s, alpha=self.alpha)


class MixingGreedy(RouterBase):
    """argmax over instances of r_mix (higher is better), ties to the lowest index."""

    name = "mixing_greedy"
    Options = MixingGreedyOptions

    def __init__(self, options: MixingGreedyOptions | None = None):
        super().__init__(options)
        self.params = self.options.params

    def select(self, cluster, rid: int) -> int:
        self._require_reset(cluster)
        return argmax(cluster_mixing_scores(cluster, rid, self.params))
