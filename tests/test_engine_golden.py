"""The hand-worked golden scenarios of ``test_reference.py``, replayed on the fast engine.

Each golden test there calls ``simulate_reference``; here the same test bodies run with that
name bound to an adapter over the fast ``Cluster``/``Engine`` (one instance, each request routed
at its ``route_s``), in both the closed-form and the one-iteration-at-a-time modes. The expected
timestamps stay the hand-derived ones.
"""

from __future__ import annotations

import pytest

import test_reference as golden
from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig
from llm_lb_gym.sim.reference import RefResult, RefStats
from llm_lb_gym.sim.request import RequestTable

GOLDEN = [
    "test_one_request_alone", "test_kv_shortage_preempts_most_recently_admitted",
    "test_kv_shortage_request_preempts_itself", "test_chunked_prefill_splits_long_prompt_under_budget",
    "test_fcfs_head_of_line_blocking", "test_bin_packing_skips_what_does_not_fit",
    "test_least_work_left_orders_by_predicted_work", "test_fcfs_ignores_predicted_work",
    "test_watermark_blocks_an_admission_that_would_fit", "test_without_watermark_both_fit",
    "test_token_budget_limits_one_prefill_batch", "test_chunked_equals_unchunked_for_one_request_within_budget",
]


def engine_adapter(fast: bool):
    def simulate(requests, cfg, check=True):
        order = sorted(range(len(requests)), key=lambda i: requests[i].route_s)
        table = RequestTable([requests[i].route_s for i in order], [requests[i].prompt_tokens for i in order],
                             [requests[i].decode_tokens for i in order],
                             [requests[i].pred_decode_tokens for i in order])
        cluster = Cluster(ClusterConfig(num_instances=1, engine=cfg, fast=fast), table, check=True)
        for k in range(table.n):
            cluster.advance_to(table.arrival_s[k])
            while cluster.queue:
                cluster.route(0)
        cluster.run_to_completion()
        assert cluster.done
        pos = {i: k for k, i in enumerate(order)}
        results = [RefResult(r.rid, table.first_scheduled_s[pos[j]], table.first_token_s[pos[j]],
                             table.finish_s[pos[j]], table.preemptions[pos[j]])
                   for j, r in enumerate(requests)]
        e = cluster.engines[0]
        e._sync_used()
        stats = RefStats(e.n_iterations, e.n_preemptions, e.peak_used, max(r.finish_s for r in results))
        return results, stats
    return simulate


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "step"])
@pytest.mark.parametrize("name", GOLDEN)
def test_golden_scenario_on_engine(name, fast, monkeypatch):
    monkeypatch.setattr(golden, "simulate_reference", engine_adapter(fast))
    fn = getattr(golden, name)
    fn()


@pytest.mark.parametrize("route_b", [2.5, 3.25])
def test_two_requests_continuous_batching_on_engine(route_b, monkeypatch):
    monkeypatch.setattr(golden, "simulate_reference", engine_adapter(True))
    golden.test_two_requests_continuous_batching(route_b)
