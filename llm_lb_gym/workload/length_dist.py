"""Token-length distributions fitted to summary statistics (a mean, optionally a heavy share).

Papers and dataset cards report a mean length per task and sometimes the share of "heavy"
requests; the simulator needs whole distributions. The family here is a discretised lognormal
(LLM prompt and output lengths are right-skewed and roughly lognormal), optionally *spliced* at
a heavy threshold ``t``: the lognormal's mass below ``t`` and at or above ``t`` is rescaled so
that exactly ``heavy_share`` of the requests have ``t`` tokens or more. A plain lognormal cannot
match the paper's Table 1 at ``t`` = 300 tokens: a lognormal of mean ``m`` has at most
``1 - Phi(sqrt(2 ln(t/m)))`` of its mass at ``>= t`` (11% for sentiment's 142.53, 3.8% for
translation's 61.76), while the table says 41.01% and 9.18%. Sentiment's heavy 41% alone
contribute >= 123 tokens of its mean, so its light 59% average at most 33 tokens: the data are
two-humped. The splice gives each task a light body and a heavy hump, with the remaining
freedom fixed by maximum entropy (``fit_spliced``).

Integer lengths are ``K = max(1, ceil(X))`` for a continuous ``X``, so ``K >= t`` exactly when
``X > t - 1``; the fit matches the mean of ``K`` itself (computed exactly from the CDF), not of
``X``. Above ``max_tokens`` a distribution either truncates (the request is filtered out, as the
paper filters prompts over 1,000 tokens) or clips (generation stops at the context window, as
a vLLM server stops at ``max_model_len``).

SciPy (normal CDF/quantile, root finding) is imported on first use, so importing the package and
using trace workloads does not pay for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .._validate import ConfigError, check_choice, check_int, check_range

OVERFLOW_CHOICES = ("truncate", "clip")
SIGMA_GRID = np.round(np.arange(0.2, 3.0001, 0.2), 10)
"""Log-space spreads searched by ``fit_spliced``; 3.0 is already an extreme tail."""
_TINY = 1e-280


@lru_cache(maxsize=16)
def _integer_grid(max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """``k = 0 .. max_tokens`` and ``log(max(k, 1))``, shared by every CDF sum over lengths."""
    k = np.arange(0, max_tokens + 1, dtype=np.float64)
    log_k = np.log(np.maximum(k, 1.0))
    k.setflags(write=False)
    log_k.setflags(write=False)
    return k, log_k


@dataclass(frozen=True)
class TokenLengthDist:
    """Integer lengths ``K = max(1, ceil(X))``, ``X`` lognormal(mu, sigma), optionally spliced."""

    mu: float
    """Log-space location of the underlying lognormal."""
    sigma: float
    """Log-space spread of the underlying lognormal (> 0)."""
    max_tokens: int
    """Largest length produced."""
    overflow: str = "truncate"
    """Lengths above ``max_tokens``: "truncate" (condition on <= max) or "clip" (set to max)."""
    heavy_tokens: int | None = None
    """Splice threshold ``t``: ``P(K >= t) = heavy_share`` exactly; None for a plain lognormal."""
    heavy_share: float | None = None
    """Probability of ``K >= heavy_tokens`` (needed iff ``heavy_tokens`` is set)."""

    def __post_init__(self) -> None:
        check_range("mu", self.mu)
        check_range("sigma", self.sigma, 0.0, lo_open=True)
        check_int("max_tokens", self.max_tokens, 1)
        check_choice("overflow", self.overflow, OVERFLOW_CHOICES)
        if (self.heavy_tokens is None) != (self.heavy_share is None):
            raise ConfigError("heavy_tokens and heavy_share must be given together")
        if self.heavy_tokens is not None:
            check_int("heavy_tokens", self.heavy_tokens, 2, self.max_tokens)
            check_range("heavy_share", self.heavy_share, 0.0, 1.0, lo_open=True, hi_open=True)
            if self.overflow != "clip":
                raise ConfigError("a spliced distribution needs overflow='clip'; allowed: clip")

    # -- continuous part ---------------------------------------------------------------------
    def _cdf_log_x(self, log_x: np.ndarray) -> np.ndarray:
        """CDF of the (spliced) continuous ``X`` at ``exp(log_x)``, before the cap.

        One ``ndtr`` per point (the fit calls this a few hundred times on 4,096 points); the
        log-space form is used only when a side's normaliser underflows.
        """
        from scipy.special import log_ndtr, ndtr

        z = (np.asarray(log_x, dtype=np.float64) - self.mu) / self.sigma
        if self.heavy_tokens is None:
            return ndtr(z)
        h = self.heavy_share
        zs = (math.log(self.heavy_tokens - 1) - self.mu) / self.sigma
        light = z <= zs
        out = np.empty_like(z)
        zl, zh = z[light], z[~light]
        norm_light, norm_heavy = float(ndtr(zs)), float(ndtr(-zs))
        if norm_light > _TINY:
            out[light] = (1.0 - h) * np.minimum(ndtr(zl) / norm_light, 1.0)
        else:
            out[light] = (1.0 - h) * np.exp(np.minimum(log_ndtr(zl) - log_ndtr(zs), 0.0))
        if norm_heavy > _TINY:
            out[~light] = 1.0 - h * np.minimum(ndtr(-zh) / norm_heavy, 1.0)
        else:
            out[~light] = 1.0 - h * np.exp(np.minimum(log_ndtr(-zh) - log_ndtr(-zs), 0.0))
        return out

    def _quantile_x(self, q: np.ndarray) -> np.ndarray:
        """Inverse of ``_cdf_log_x`` (in x) for ``q`` in [0, 1)."""
        from scipy.special import ndtr, ndtri

        q = np.asarray(q, dtype=np.float64)
        if self.heavy_tokens is None:
            return np.exp(self.mu + self.sigma * ndtri(q))
        h = self.heavy_share
        zs = (math.log(self.heavy_tokens - 1) - self.mu) / self.sigma
        light = q < 1.0 - h
        with np.errstate(divide="ignore", invalid="ignore"):
            z_light = ndtri(np.clip(q / (1.0 - h), 0.0, 1.0) * ndtr(zs))
            z_heavy = -ndtri(np.clip((1.0 - q) / h, 0.0, 1.0) * ndtr(-zs))
        # Keep each side on its side of the splice despite rounding in ndtri.
        z = np.where(light, np.minimum(z_light, zs), np.maximum(z_heavy, np.nextafter(zs, np.inf)))
        return np.exp(self.mu + self.sigma * z)

    # -- integer lengths ---------------------------------------------------------------------
    def cdf(self, k: np.ndarray) -> np.ndarray:
        """``P(K <= k)`` for integers ``k`` (0 below 1, 1 from ``max_tokens`` on)."""
        k = np.asarray(k, dtype=np.float64)
        return self._cdf_int(k, np.log(np.maximum(k, 1.0)))

    def _cdf_int(self, k: np.ndarray, log_k: np.ndarray) -> np.ndarray:
        if self.overflow == "truncate":  # plain lognormal conditioned on X <= max_tokens
            from scipy.special import log_ndtr

            z = (np.asarray(log_k, dtype=np.float64) - self.mu) / self.sigma
            z_cap = (math.log(self.max_tokens) - self.mu) / self.sigma
            g = np.exp(np.minimum(log_ndtr(z) - log_ndtr(z_cap), 0.0))
        else:
            g = self._cdf_log_x(log_k)
        return np.where(k < 1, 0.0, np.where(k >= self.max_tokens, 1.0, np.minimum(g, 1.0)))

    def mean(self) -> float:
        """Exact mean of ``K``: the sum over k of ``P(K > k)``."""
        k, log_k = _integer_grid(self.max_tokens)
        return float(np.sum(1.0 - self._cdf_int(k[:-1], log_k[:-1])))

    def pmf(self) -> np.ndarray:
        """``P(K = k)`` for k = 1 .. max_tokens."""
        k, log_k = _integer_grid(self.max_tokens)
        return np.diff(self._cdf_int(k, log_k))

    def entropy_nats(self) -> float:
        """Shannon entropy of ``K`` in nats."""
        p = self.pmf()
        p = p[p > 0]
        return float(-np.sum(p * np.log(p)))

    def share_at_least(self, tokens: int) -> float:
        """``P(K >= tokens)``."""
        return float(1.0 - self.cdf(np.float64(tokens - 1)))

    def sample(self, u: np.ndarray, cap_tokens: np.ndarray | int | None = None) -> np.ndarray:
        """Map uniforms ``u`` in [0, 1) to int64 lengths (inverse CDF).

        Taking uniforms instead of a generator lets a mixture draw one uniform per request and
        route it through its own task's distribution, so a batch does not depend on how many
        requests each task got. ``cap_tokens`` (scalar or per request) clips further, e.g. to
        the room left in the context window after the prompt.
        """
        q = np.asarray(u, dtype=np.float64)
        if self.overflow == "truncate":
            q = q * float(self._cdf_log_x(np.float64(math.log(self.max_tokens))))
        k = np.ceil(self._quantile_x(q))
        k = np.clip(np.nan_to_num(k, nan=1.0, posinf=self.max_tokens), 1, self.max_tokens)
        if cap_tokens is not None:
            k = np.minimum(k, cap_tokens)
        return k.astype(np.int64)


def _solve_mu(mean_tokens: float, make) -> float:
    """The ``mu`` at which ``make(mu).mean()`` equals ``mean_tokens`` (mean is increasing in mu)."""
    from scipy.optimize import brentq

    center = math.log(mean_tokens)
    lo, hi = center - 15.0, center + 15.0
    f_lo, f_hi = make(lo).mean() - mean_tokens, make(hi).mean() - mean_tokens
    if f_lo > 0 or f_hi < 0:
        probe = make(center)
        raise ConfigError(
            f"mean_tokens={mean_tokens!r} is out of reach for this family; allowed: "
            f"[{f_lo + mean_tokens:.2f}, {f_hi + mean_tokens:.2f}] "
            f"(max_tokens={probe.max_tokens}, heavy_tokens={probe.heavy_tokens}, "
            f"heavy_share={probe.heavy_share})")
    return brentq(lambda mu: make(mu).mean() - mean_tokens, lo, hi, xtol=1e-9)


@lru_cache(maxsize=64)
def fit_lognormal(mean_tokens: float, sigma: float, max_tokens: int,
                  overflow: str = "truncate") -> TokenLengthDist:
    """Plain discretised lognormal of log-spread ``sigma`` whose integer mean is ``mean_tokens``."""
    check_range("mean_tokens", mean_tokens, 1.0, max_tokens, lo_open=True, hi_open=True)
    mu = _solve_mu(mean_tokens,
                   lambda m: TokenLengthDist(m, sigma, max_tokens, overflow))
    return TokenLengthDist(mu, sigma, max_tokens, overflow)


@lru_cache(maxsize=64)
def fit_spliced(mean_tokens: float, heavy_share: float, heavy_tokens: int,
                max_tokens: int) -> TokenLengthDist:
    """Maximum-entropy spliced lognormal with the given mean and heavy share.

    The mean and ``P(K >= heavy_tokens) = heavy_share`` leave one degree of freedom (a curve of
    (mu, sigma)). Of that curve we take the member of largest entropy: the distribution that
    assumes least beyond the two published numbers (Jaynes' principle). Smaller sigmas pile
    the requests onto two spikes, larger ones onto 1 token and a far tail; both are stronger
    claims than the table makes. Search: ``SIGMA_GRID`` (skipping sigmas whose mean range
    cannot reach ``mean_tokens``), then a bounded refinement between the best point's
    neighbours.
    """
    check_range("mean_tokens", mean_tokens, 1.0, max_tokens, lo_open=True, hi_open=True)
    check_range("heavy_share", heavy_share, 0.0, 1.0, lo_open=True, hi_open=True)
    check_int("heavy_tokens", heavy_tokens, 2, max_tokens)
    from scipy.optimize import minimize_scalar

    def dist(sigma: float) -> TokenLengthDist:
        mu = _solve_mu(mean_tokens, lambda m: TokenLengthDist(
            m, sigma, max_tokens, "clip", heavy_tokens, heavy_share))
        return TokenLengthDist(mu, sigma, max_tokens, "clip", heavy_tokens, heavy_share)

    def entropy(sigma: float) -> float:
        try:
            return dist(sigma).entropy_nats()
        except ConfigError:
            return float("nan")

    values = np.array([entropy(s) for s in SIGMA_GRID])
    if np.all(np.isnan(values)):
        raise ConfigError(
            f"no lognormal splice has mean_tokens={mean_tokens!r} with heavy_share={heavy_share!r} "
            f"at heavy_tokens={heavy_tokens!r}; allowed means: roughly "
            f"({1 - heavy_share + heavy_share * heavy_tokens:.1f}, "
            f"{(1 - heavy_share) * (heavy_tokens - 1) + heavy_share * max_tokens:.1f})")
    i = int(np.nanargmax(values))
    lo, hi = SIGMA_GRID[max(i - 1, 0)], SIGMA_GRID[min(i + 1, len(SIGMA_GRID) - 1)]
    best = minimize_scalar(lambda s: -np.nan_to_num(entropy(s), nan=-np.inf),
                           bounds=(lo, hi), method="bounded", options={"xatol": 2e-3})
    sigma = float(best.x) if -best.fun >= values[i] else float(SIGMA_GRID[i])
    return dist(sigma)
