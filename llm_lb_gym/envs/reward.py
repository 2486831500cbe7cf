"""The reward's pieces: ideal completion times, the guidance weight schedule and term.

    r_t = -penalty_scale * sum over the decision intervals elapsed in the step of
              sum_j (1 / T_j) (1 - f_jt)                       (requests in the system)
          + completion_reward * (requests completed in the step)
          + w_k * h_t                                           (heuristic guidance)
          + slo_reward * (requests completed in the step within both SLO deadlines)

T_j is request j's ideal latency (alone on an idle instance, with its *predicted* decode
length); f_jt = generated / predicted decode tokens, clipped to 1. Summing the in-system term
over elapsed intervals makes the return independent of how many routing actions share one
decision time, and makes a fast-forward over idle intervals pay exactly what deferring through
them would. h_t = r_mix(chosen) - max_l r_mix(l) <= 0 for a routing action (0 for the instance
the mixing estimator prefers, and for defer). w_k: 0 (baseline), guidance_scale
(workload_aware), guidance_scale * exp(-decay * k) (workload_guided; k = training episodes so
far, so the agent ends up optimising the true objective). The SLO term (``reward=slo``) is
discounted by its completion's grid point like the completion term, so with every other term
at 0 and per-step discount 1 the return is slo_reward x the requests meeting their SLO.
"""

from __future__ import annotations

import math


from ..routers.mixing import mixing_score
from ..sim.latency import ideal_latency_s  # noqa: F401  (the env's T_j; lives with the latency model)
from .config import RewardConfig


def guidance_weight(cfg: RewardConfig, episode: int) -> float:
    """w_k for training episode ``k``."""
    if cfg.mode == "baseline":
        return 0.0
    if cfg.mode == "workload_aware":
        return cfg.guidance_scale
    return cfg.guidance_scale * math.exp(-cfg.decay * episode)


def guidance_term(committed_tokens: list[float], prompt_tokens: int, pred_decode_tokens: float,
                  chosen: int, cfg: RewardConfig) -> float:
    """h = r_mix(chosen) - max_l r_mix(l) (<= 0). r_mix does not increase with an instance's
    load (``mixing_score``), so the max is the least-loaded instance's score: two evaluations
    per routing action instead of m (equal to ``max(mixing_scores(...))``, a test checks)."""
    p = cfg.mixing
    best = mixing_score(min(committed_tokens), prompt_tokens, pred_decode_tokens, p)
    return mixing_score(committed_tokens[chosen], prompt_tokens, pred_decode_tokens, p) - best
