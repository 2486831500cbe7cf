"""The paper's analytic estimate of the cost of mixing a new request into an instance (§5.2).

For incoming request i (prompt p_i, predicted decode d_i) and instance l holding requests j:

    T_p = grad1 * (p_i^2 + sum_j (p_j + d_j))        prompt impact (seconds-like)
    r_p = 1 if T_p <= eps else 1 - T_p / eps
    r_d = -grad2 * (sum_j (p_j + d_j) + p_i + d_i)   decode impact on the requests there
    r_mix = alpha * r_p + (1 - alpha) * r_d

Higher is better. ``sum_j (p_j + d_j)`` is the instance's committed tokens (prompt plus predicted
decode of every request routed there and not finished), an O(1) aggregate of the engine.
Defaults: the paper's V100 gradients (grad1 = 3.2e-4, grad2 = 3.3e-5), alpha = 0.5, and
eps = 0.5 s, the paper's heavy-prompt threshold (prefill >= 0.5 s); the paper does not state
eps, so it is an option. The mixing-greedy router and the guidance reward both use it; it lives
here, beside the router, because it reads only the simulator's state, and the env's reward
imports it from here (envs -> routers points down the layers).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._validate import check_range


@dataclass(frozen=True)
class MixingParams:
    grad1: float = 3.2e-4
    """Seconds per prompt token (paper, Llama-2-7B on V100)."""
    grad2: float = 3.3e-5
    """Decode-time gradient per token in the instance (paper, Llama-2-7B on V100)."""
    eps_s: float = 0.5
    """Prompt-impact threshold: no prompt penalty below it."""
    alpha: float = 0.5
    """Weight of the prompt term against the decode term."""

    def __post_init__(self) -> None:
        check_range("reward.mixing.grad1", self.grad1, 0.0)
        check_range("reward.mixing.grad2", self.grad2, 0.0)
        check_range("reward.mixing.eps_s", self.eps_s, 0.0, lo_open=True)
        check_range("reward.mixing.alpha", self.alpha, 0.0, 1.0)


def mixing_score(load: float, prompt_tokens: int, pred_decode_tokens: float,
                 params: MixingParams) -> float:
    """r_mix of placing the request on one instance holding ``load`` committed tokens (the same
    arithmetic as ``mixing_scores``). Every step of it is monotone in ``load``, in floating
    point too, so r_mix never increases with load: the least-loaded instance scores highest."""
    tp = params.grad1 * (prompt_tokens * prompt_tokens + load)
    rp = 1.0 if tp <= params.eps_s else 1.0 - tp / params.eps_s
    rd = -params.grad2 * (load + (prompt_tokens + pred_decode_tokens))
    a = params.alpha
    return a * rp + (1.0 - a) * rd


def mixing_scores(committed_tokens: list[float], prompt_tokens: int, pred_decode_tokens: float,
                  params: MixingParams) -> list[float]:
    """r_mix of placing the request on each instance (given each instance's committed tokens)."""
    g1, g2, eps, a = params.grad1, params.grad2, params.eps_s, params.alpha
    p2 = prompt_tokens * prompt_tokens
    own = prompt_tokens + pred_decode_tokens
    out = []
    for load in committed_tokens:
        tp = g1 * (p2 + load)
        rp = 1.0 if tp <= eps else 1.0 - tp / eps
        rd = -g2 * (load + own)
        out.append(a * rp + (1.0 - a) * rd)
    return out


def cluster_mixing_scores(cluster, rid: int, params: MixingParams) -> list[float]:
    """``mixing_scores`` for request ``rid`` over the cluster's instances."""
    tb = cluster.table
    return mixing_scores([e.committed_tokens for e in cluster.engines], tb.prompt[rid],
                         tb.pred[rid], params)
