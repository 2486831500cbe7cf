"""Chunked and unchunked prefill of the same prompt do the same causal attention work.

A chunk of c tokens after q cached tokens attends to q + (c + 1) / 2 keys on average, so any
chunking of an L-token prompt sums to L (L + 1) / 2 (query, key) pairs, as one whole prefill
does. Chunking may only change per-iteration costs: the constant (base + CPU) per extra
iteration and the linear layers' price of each iteration's token count (the knee, which every
iteration's batch gets once, GEMM tiles, token segments). Checked on the fast engine (both
modes) and on the step-by-step reference, with a d = 1 request so that its latency is its prefill.
"""

from __future__ import annotations

import math

import pytest

from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.latency import LatencyModel, get_preset
from llm_lb_gym.sim.reference import RefRequest, simulate_reference
from llm_lb_gym.sim.request import RequestTable

L = 126_000   # the long prompt
BUDGET = 2048


def _engine(lat: LatencyModel, chunked: bool) -> EngineConfig:
    return EngineConfig(latency=lat, max_model_len=131_072, num_kv_blocks=10_000, chunked_prefill=chunked,
                        max_num_batched_tokens=BUDGET if chunked else None)


def _prefill_s(lat: LatencyModel, chunked: bool, how: str) -> float:
    """Time from routing to the first (and only) token of one L-token prompt."""
    cfg = _engine(lat, chunked)
    if how == "reference":
        (r,), _ = simulate_reference([RefRequest(0, 0.0, L, 1, 1.0)], cfg)
        return r.first_token_s
    table = RequestTable([0.0], [L], [1], [1.0])
    cluster = Cluster(ClusterConfig(num_instances=1, engine=cfg, fast=how == "fast"), table)
    cluster.advance_to(0.0)
    cluster.route(0)
    cluster.run_to_completion()
    return table.first_token_s[0]


HOW = ["fast", "step", "reference"]


@pytest.mark.parametrize("how", HOW)
def test_chunked_prefill_does_the_same_attention_work(how):
    # Only attention (and a constant) is priced: the two must differ by the constant per extra
    # iteration, nothing else. (With c (q + c) pairs per chunk, chunked came out ~2x cheaper.)
    lat = LatencyModel(base_s=1e-3, prefill_attn_s=1e-8)
    k = math.ceil(L / BUDGET)
    whole, chunked = _prefill_s(lat, False, how), _prefill_s(lat, True, how)
    assert whole == pytest.approx(1e-3 + 1e-8 * L * (L + 1) / 2, rel=1e-12)
    assert chunked == pytest.approx(k * 1e-3 + 1e-8 * L * (L + 1) / 2, rel=1e-12)


def _linear_s(lat: LatencyModel, n: int) -> float:
    """The linear layers' cost of an n-token iteration (token curve and compute term)."""
    return lat.tokens_s(n) + lat.compute_token_s * max(0.0, lat.tiled(n) - lat.knee_tokens)


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("preset", ["llama2-7b-v100", "llama2-7b-a100"])
def test_chunked_minus_unchunked_is_per_iteration_costs_only(how, preset):
    """The difference is the constant of each extra iteration and the linear layers' cost of each
    iteration's token count (knee, tiles, token segments: one 126k-token GEMM vs 62 of 2,048);
    the attention pairs cancel."""
    lat = get_preset(preset).latency
    k = math.ceil(L / BUDGET)   # 62 chunks, all above the knee (the last: 126000 - 61*2048 = 1072)
    chunks = [BUDGET] * (k - 1) + [L - (k - 1) * BUDGET]
    assert chunks[-1] > lat.knee_tokens
    per_iteration = lat.base_s + lat.cpu_base_s + lat.cpu_seq_s   # one prompt chunk per iteration
    expected = (k - 1) * per_iteration + sum(_linear_s(lat, c) for c in chunks) - _linear_s(lat, L)
    whole, chunked = _prefill_s(lat, False, how), _prefill_s(lat, True, how)
    assert chunked - whole == pytest.approx(expected, rel=1e-9)
    if not lat.token_segments:
        # one token price: sum over chunks of max(0, c - knee) = L - k knee vs L - knee at once
        assert expected == pytest.approx((k - 1) * (per_iteration - lat.knee_tokens * lat.compute_token_s))
        assert abs(chunked - whole) < 0.01 * whole   # the prompt's work itself is the same
