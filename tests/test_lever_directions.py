"""The direction of every scored_binding / late_binding lever, against hand-worked decisions.

``test_policy_search.py`` checks that each lever *changes* an episode; a lever whose sign were
flipped would still change it. Here each lever decides one hand-built state on both sides of a
threshold worked out by hand from the module's formulas (``routers/scored_binding.py``):

    order score   = log(inv_ideal) - prompt_weight * log1p(prompt) + age_per_s * wait
                    - late_penalty * [wait > ttft deadline]          (largest goes first)
    need          = ceil((prompt + f * pred + (1 - f) * o_base) / block_size), f = reserve_frac
    room_i        = free_i - needs of i's waiting requests - growth_frac * (decode left_i - wait_left_i) / bs
    fits on i     : room_i - need >= watermark + room_margin * blocks_i,
                    and B + prefilling + waiting < seq_cap_frac * max_num_seqs
    instance      = argmax room_i / blocks_i - work_weight * work_i / (blocks_i * bs)

The states are plain objects with the attributes a router reads (``routers/base.py`` lists
them), so every number is exact; the release guarantee's bounds are far (waits of seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

from llm_lb_gym.routers import make_router


@dataclass
class Eng:
    free_blocks: int = 100
    total_blocks: int = 100
    bs: int = 4
    watermark: int = 0
    B: int = 0
    max_seqs: int = 10
    decode_left: float = 0.0
    wait_left: float = 0.0
    pending_prefill_tokens: int = 0
    prefilling: list = field(default_factory=list)
    waiting_q: list = field(default_factory=list)
    preempted_q: list = field(default_factory=list)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting_q) + len(self.preempted_q)

    def decode_tokens_left(self) -> float:
        return self.decode_left


def state(requests, engines, t: float, last_route_s=None, slo_on: bool = False):
    """A cluster at time ``t`` with ``requests`` (dicts: arrival_s, prompt, pred, inv; optional
    o_base, ttft_deadline_s) queued in arrival order."""
    cols = {k: [r.get(k, d) for r in requests] for k, d in
            (("arrival_s", 0.0), ("prompt", 8), ("pred", 8.0), ("inv", 1.0), ("o_base", 0),
             ("ttft_deadline_s", math.inf))}
    table = SimpleNamespace(arrival_s=cols["arrival_s"], prompt=cols["prompt"], pred=cols["pred"],
                            inv_ideal=cols["inv"], o_base=cols["o_base"], slo_on=slo_on,
                            ttft_deadline_s=cols["ttft_deadline_s"])
    return SimpleNamespace(t=t, queue=list(range(len(requests))), table=table, engines=engines,
                           last_route_s=last_route_s or [-math.inf] * len(engines),
                           speeds=SimpleNamespace(homogeneous=True))


def decide(cluster, **options):
    r = make_router("scored_binding", **{"period_s": 0.0, **options})
    r.reset(np.random.default_rng(0), len(cluster.engines))
    return r.select_from_queue(cluster)


# ----------------------------------------------------------------------------- order
def test_age_per_s_moves_towards_oldest_first():
    # A: arrived 0, inv 1/10; B: arrived 1, inv 1/2; t = 2. B leads by log 5 = 1.609 nats, A
    # has waited 1 s longer: A goes first once age_per_s > log 5.
    c = state([{"arrival_s": 0.0, "inv": 0.1}, {"arrival_s": 1.0, "inv": 0.5}], [Eng()], t=2.0)
    assert decide(c, age_per_s=0.0)[0] == 1
    assert decide(c, age_per_s=1.60)[0] == 1
    assert decide(c, age_per_s=1.62)[0] == 0
    assert decide(c, age_per_s=100.0)[0] == 0


def test_prompt_weight_positive_sends_short_prompts_first():
    # A: prompt 100, inv 1/2; B: prompt 10, inv 1/4. A leads by log 2 = 0.693; B's prompt term
    # is smaller by log(101 / 11) = 2.217 per unit: B first once prompt_weight > 0.3127.
    c = state([{"prompt": 100, "inv": 0.5}, {"prompt": 10, "inv": 0.25}], [Eng()], t=1.0)
    assert decide(c, prompt_weight=-5.0)[0] == 0
    assert decide(c, prompt_weight=0.31)[0] == 0
    assert decide(c, prompt_weight=0.32)[0] == 1


def test_late_penalty_positive_sends_requests_past_their_deadline_back():
    # A (inv 1/2) missed its TTFT deadline (waited 2 s > 1 s), B (inv 1/4) did not; A leads by
    # log 2 = 0.693: a penalty above that puts B first, a negative one keeps A first.
    reqs = [{"inv": 0.5, "ttft_deadline_s": 1.0}, {"arrival_s": 1.5, "inv": 0.25, "ttft_deadline_s": 5.0}]
    c = state(reqs, [Eng()], t=2.0, slo_on=True)
    assert decide(c, late_penalty=0.69)[0] == 0
    assert decide(c, late_penalty=0.70)[0] == 1
    assert decide(c, late_penalty=-50.0)[0] == 0
    assert decide(state(reqs, [Eng()], t=2.0, slo_on=False), late_penalty=50.0)[0] == 0   # no SLOs: ignored


@pytest.mark.parametrize("router", ["late_binding", "scored_binding"])
def test_max_wait_s_puts_the_overdue_head_first(router):
    # A (long, waited 2 s) vs B (short): shortest first unless A waited past max_wait_s.
    c = state([{"arrival_s": 0.0, "inv": 0.1}, {"arrival_s": 1.5, "inv": 0.5}], [Eng()], t=2.0)
    opts = {"period_s": 0.0} if router == "late_binding" else {}
    for max_wait_s, first in ((None, 1), (2.5, 1), (1.9, 0)):
        r = make_router(router, **opts, max_wait_s=max_wait_s, **({"prompt_weight": 0.1} if router != "late_binding" else {}))
        r.reset(np.random.default_rng(0), 1)
        assert r.select_from_queue(c)[0] == first, max_wait_s


# ----------------------------------------------------------------------------- reservation and room
def test_reserve_frac_counts_more_of_the_predicted_decode():
    # prompt 8, pred 40, block size 4: need = ceil((8 + 40 f) / 4) = 2 (f=0), 7 (0.5), 12 (1);
    # 10 free blocks: it fits unless f reserves more than 10 blocks, i.e. f > 0.8.
    c = state([{"prompt": 8, "pred": 40.0}], [Eng(free_blocks=10)], t=1.0)
    assert decide(c, reserve_frac=0.0) == (0, 0)
    assert decide(c, reserve_frac=0.8) == (0, 0)          # 8 + 32 = 40 tokens = 10 blocks
    assert decide(c, reserve_frac=0.81) is None           # 40.4 tokens -> 11 blocks
    assert decide(c, reserve_frac=1.0) is None


def test_room_margin_positive_holds_more_negative_overcommits():
    # 50 free of 100, need 2 (prompt 8, reserve_frac 0): 48 left; fits iff 48 >= 100 * margin.
    c = state([{"prompt": 8}], [Eng(free_blocks=50)], t=1.0)
    assert decide(c, room_margin=0.48) == (0, 0)
    assert decide(c, room_margin=0.49) is None
    full = state([{"prompt": 8}], [Eng(free_blocks=1)], t=1.0)     # 1 free, need 2
    assert decide(full, room_margin=0.0) is None
    assert decide(full, room_margin=-0.01) == (0, 0)               # 1 - 2 >= -1


def test_growth_frac_counts_the_running_requests_growth_against_room():
    # Instance 0: 60 free, its running requests will still write 400 tokens (100 blocks);
    # instance 1: 50 free, nothing running. Room 60 - 100 g vs 50: instance 0 while g < 0.1.
    c = state([{"prompt": 8}], [Eng(free_blocks=60, B=2, decode_left=400.0), Eng(free_blocks=50)], t=1.0)
    assert decide(c, growth_frac=0.0) == (0, 0)
    assert decide(c, growth_frac=0.09) == (0, 0)
    assert decide(c, growth_frac=0.11) == (0, 1)
    alone = state([{"prompt": 8}], [Eng(free_blocks=60, B=2, decode_left=400.0)], t=1.0)
    assert decide(alone, growth_frac=0.58) == (0, 0)               # 60 - 58 = 2 >= need 2
    assert decide(alone, growth_frac=0.59) is None


def test_seq_cap_frac_caps_the_sequences_an_instance_takes():
    # 5 sequences on an instance of 10 slots: it takes one more iff 5 < 10 * cap.
    c = state([{"prompt": 8}], [Eng(B=5)], t=1.0)
    assert decide(c, seq_cap_frac=0.51) == (0, 0)
    assert decide(c, seq_cap_frac=0.5) is None


def test_work_weight_prefers_the_instance_with_less_outstanding_work():
    # Instance 0: room 60 / 100 and 800 tokens outstanding; instance 1: room 50 / 100, none.
    # Value 0.6 - 800 w / 400 vs 0.5: instance 1 once w > 0.05.
    c = state([{"prompt": 8}], [Eng(free_blocks=60, B=1, decode_left=800.0), Eng(free_blocks=50)], t=1.0)
    assert decide(c, work_weight=0.0) == (0, 0)
    assert decide(c, work_weight=0.049) == (0, 0)
    assert decide(c, work_weight=0.051) == (0, 1)


@pytest.mark.parametrize("router", ["late_binding", "scored_binding"])
def test_period_s_longer_rounds_hold_longer(router):
    # Last release at 1.0, now 1.25: a round is open iff period_s <= 0.25 (since_release).
    c = state([{"prompt": 8}], [Eng()], t=1.25, last_route_s=[1.0])
    for period_s, out in ((0.0, (0, 0)), (0.2, (0, 0)), (0.3, None), (2.0, None)):
        r = make_router(router, period_s=period_s, rounds="since_release")
        r.reset(np.random.default_rng(0), 1)
        assert r.select_from_queue(c) == out, period_s


def test_late_binding_reserve_full_holds_where_prompt_fits():
    c = state([{"prompt": 8, "pred": 40.0}], [Eng(free_blocks=10)], t=1.0)
    for reserve, out in (("prompt", (0, 0)), ("full", None)):   # 2 vs 12 blocks needed of 10
        r = make_router("late_binding", period_s=0.0, reserve=reserve)
        r.reset(np.random.default_rng(0), 1)
        assert r.select_from_queue(c) == out, reserve
