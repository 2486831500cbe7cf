"""Read a host's constants off lone requests: what a few minutes on a server of your own pins down.

The serving fit (``serving.py``) sets per-GPU factors and per-endpoint frontends from the fitted
hosts. Another host of the same GPU and engine can differ in exactly those constants: its API
server's per-request path (about 7 ms for a short request on silybench's GCP H100, ~20 ms on the
L4 page, ~30 ms on kvcached's host) and what its kernels achieve (silybench's H100 SXM on vLLM
0.30 prefills ~1.5x and reads the KV cache ~1.8x faster than GPUStack's H100 pages on vLLM 0.11
imply). None of that follows from the GPU's name. What does follow is what the simulator does
with them under load: batching, chunked prefill, queueing, preemption.

So: send the server requests one at a time (no batching, no queueing: each lone request's TTFT
is the frontend's path plus one prefill, its ITL one decode step) at one or more prompt lengths,
and fit, on the case's figures only (TTFT as published, median ITL or TPOT):

- ``frontend``: one multiplier on the endpoint frontend's fixed per-request costs (``delay_s``,
  ``request_s``), from the TTFT of the shortest prompt;
- ``bandwidth``: the weight-read factor, from the ITL;
- with two or more prompt lengths (the longest at least twice the shortest), also ``compute``
  (one multiplier on the GEMM and prefill-attention factors) from how TTFT grows with the prompt,
  and ``kv_bandwidth`` from how ITL grows with the context.

One reading of a length pins two constants, two lengths pin four: the fit never has more unknowns
than figures. What lone requests cannot show is left as fitted: the frontend's per-token costs
(they matter when many streams share the API server's CPU), the engine's CPU step, and anything
of the dynamics under load (the L4 page's TTFT at 16-32 in flight, which grows with the number of
streams, is not its per-token output cost: 3.8-100 us per token leave it unchanged, docs/calibration.md). ``llm-lb-gym validate
--readings`` fits each source's lone-request cases and judges only its other cases.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .corpus import Case, Corpus
from .serving import LOG_BOUNDS, ServingCalibration, evaluate

TTFT_KEYS = ("mean_ttft_ms", "median_ttft_ms", "p95_ttft_ms")
"""A reading's TTFT: the first of these the case publishes (a lone request's are all alike)."""
STEP_KEYS = ("median_itl_ms", "median_tpot_ms")
"""A reading's decode step: the median ITL, else the median TPOT."""
SPREAD = 2.0
"""The longest reading's prompt must be this many times the shortest's for the slopes (compute,
KV-read bandwidth) to be read; else only the frontend and the weight-read factor are."""
READING_REQUESTS = 2
"""Requests replayed per reading of fixed shapes: lone requests in a closed loop of one are all
alike, so two give the figures of fifty (the second shows the steady state after the first)."""


def is_reading(case: Case) -> bool:
    """A case of lone requests: a closed loop of one in flight, or a single request."""
    w = case.workload
    return (w.kind == "closed" and w.concurrency == 1) or w.num_requests == 1


def _key(case: Case, keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if k in case.measured), None)


def parameters(readings: Sequence[Case]) -> tuple[str, ...]:
    """What ``readings`` identify (module doc): two constants per prompt length, at most four."""
    prompts = [c.workload.prompt_tokens for c in readings]
    if min(prompts) * SPREAD <= max(prompts):
        return ("frontend", "bandwidth", "compute", "kv_bandwidth")
    return ("frontend", "bandwidth")


@dataclass(frozen=True)
class HostFit:
    """The constants read off one host's lone requests, and the calibration they give."""

    multipliers: dict[str, float]
    """Each fitted parameter's multiplier of the calibration it started from."""
    calibration: ServingCalibration
    residuals: dict[str, float]
    """simulated / measured - 1 of each reading's figures after the fit (``case id:figure``)."""


def _apply(start: ServingCalibration, gpu: str, endpoint: str, names: Sequence[str], x: np.ndarray) -> ServingCalibration:
    m = dict(zip(names, np.exp(x)))
    sc = start.scale(gpu)
    kw = {"bandwidth": sc.bandwidth * m["bandwidth"]}
    if "compute" in m:
        kw.update(linear_flops=sc.linear_flops * m["compute"], attention_flops=sc.attention_flops * m["compute"],
                  kv_bandwidth=sc.kv_bandwidth * m["kv_bandwidth"])
    frontends = dict(start.frontends)
    fe = frontends.get(endpoint)
    if fe is not None:
        frontends[endpoint] = dataclasses.replace(fe, delay_s=fe.delay_s * m["frontend"],
                                                  request_s=fe.request_s * m["frontend"])
    return dataclasses.replace(start, scales={**start.scales, gpu: dataclasses.replace(sc, **kw)}, frontends=frontends)


def _bounds(start: ServingCalibration, gpu: str, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """log-multiplier bounds that keep every factor within the serving fit's ranges."""
    sc = start.scale(gpu)
    lo, hi = [], []
    for n in names:
        if n == "frontend":
            lo.append(math.log(0.02)), hi.append(math.log(20.0))
            continue
        fields_ = ("linear_flops", "attention_flops") if n == "compute" else (n,)
        lo.append(max(math.log(LOG_BOUNDS[f][0] / getattr(sc, f)) for f in fields_))
        hi.append(min(math.log(LOG_BOUNDS[f][1] / getattr(sc, f)) for f in fields_))
    return np.array(lo), np.array(hi)


def fit_host(readings: Sequence[Case], corpus: Corpus, start: ServingCalibration) -> HostFit:
    """Fit :func:`parameters` of ``readings`` (lone-request cases of one GPU and endpoint) by
    least squares on the log-ratios of their TTFTs and decode steps; ``start``'s other constants
    are kept."""
    from scipy.optimize import least_squares

    if not readings:
        raise ValueError("fit_host: no readings (cases of lone requests)")
    bad = [c.id for c in readings if not is_reading(c)]
    if bad:
        raise ValueError(f"fit_host: {', '.join(bad)} are not lone-request cases (a closed loop of 1, or 1 request)")
    hosts = {(c.gpu, c.endpoint, c.model, c.tensor_parallel) for c in readings}
    gpus, endpoints = {h[0] for h in hosts}, {h[1] for h in hosts}
    if len(gpus) > 1 or len(endpoints) > 1:
        raise ValueError(f"fit_host: readings of one GPU and endpoint; got GPUs {sorted(gpus)}, endpoints {sorted(endpoints)}")
    gpu, endpoint = gpus.pop(), endpoints.pop()
    figures = [(c, k) for c in readings for k in (_key(c, TTFT_KEYS), _key(c, STEP_KEYS)) if k]
    names = parameters(readings)
    if len(figures) < len(names):
        raise ValueError(f"fit_host: {len(figures)} figures cannot pin {len(names)} constants ({', '.join(names)})")
    short = [c if c.workload.length_spread else   # drawn lengths depend on how many are drawn
             dataclasses.replace(c, workload=dataclasses.replace(c.workload, num_requests=min(c.workload.num_requests,
                                                                                                READING_REQUESTS)))
             for c in readings]

    def residuals(x: np.ndarray) -> np.ndarray:
        results = {r.case.id: r for r in evaluate(short, corpus, _apply(start, gpu, endpoint, names, x))}
        return np.array([math.log1p(results[c.id].errors[k]) for c, k in figures])

    lo, hi = _bounds(start, gpu, names)
    x0 = np.clip(np.zeros(len(names)), lo + 1e-9, hi - 1e-9)
    res = least_squares(residuals, x0, bounds=(lo, hi), diff_step=0.02, max_nfev=200)
    return HostFit({n: float(v) for n, v in zip(names, np.exp(res.x))}, _apply(start, gpu, endpoint, names, res.x),
                   {f"{c.id}:{k}": float(math.expm1(r)) for (c, k), r in zip(figures, res.fun)})
