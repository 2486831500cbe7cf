"""Actions: integers in 0..m only; everything else is a clear error (issue 10, item 5)."""

from __future__ import annotations

import numpy as np
import pytest

from llm_lb_gym.envs import LLMClusterEnv
from llm_lb_gym.envs.actions import coerce_action


@pytest.fixture(scope="module")
def env():
    e = LLMClusterEnv(num_requests=200)
    e.reset(seed=0)
    return e


@pytest.mark.parametrize("action", [
    2, np.int64(2), np.int8(2), np.uint16(2), np.array(2), np.array([2]),
    np.array([2], dtype=np.uint8)])
def test_integer_actions_are_accepted(action):
    assert coerce_action(action, 5) == 2 and type(coerce_action(action, 5)) is int


@pytest.mark.parametrize("action", [
    2.7, -0.5, 2.0, np.float32(1.0), "1", b"1", True, False, np.bool_(True), None, [1],
    np.array(1.0), np.array([True]), np.array(["1"]), 1 + 0j])
def test_non_integer_actions_raise_type_error(action):
    with pytest.raises(TypeError, match=r"allowed: an integer in 0\.\.4"):
        coerce_action(action, 5)


@pytest.mark.parametrize("action", [-1, 5, np.int64(7), np.array([9]), np.array([1, 2]),
                                    np.zeros((1, 1), dtype=int), np.array([], dtype=int)])
def test_out_of_range_or_shape_raises_value_error(action):
    with pytest.raises(ValueError, match=r"allowed: an integer in 0\.\.4"):
        coerce_action(action, 5)


@pytest.mark.parametrize("action", [2.7, -0.5, "1", True])
def test_step_rejects_what_it_used_to_truncate(env, action):
    """step(2.7), step(-0.5), step("1"), step(True) used to route to instances 2, 0, 1, 1."""
    before = (env.cluster.t, len(env.cluster.queue), env.cluster.n_routed)
    with pytest.raises(TypeError, match="allowed"):
        env.step(action)
    assert (env.cluster.t, len(env.cluster.queue), env.cluster.n_routed) == before


def test_step_takes_numpy_and_array_actions():
    """Each form routes the head request to the instance it names (defer routes nothing)."""
    env = LLMClusterEnv(num_requests=200, arrival_rate_rps=200.0)
    env.reset(seed=0)
    tb = env.cluster.table
    for a in (np.int64(0), np.array(1), np.array([2]), np.uint8(3), 3, np.int32(1), env.m, np.array([env.m])):
        while not env.cluster.queue:
            env.step(env.m)
        rid, routed = env.cluster.queue[0], env.cluster.n_routed
        env.step(a)
        target = int(np.asarray(a).reshape(-1)[0])
        if target < env.m:
            assert tb.instance[rid] == target and env.cluster.n_routed == routed + 1, a
        else:
            assert env.cluster.n_routed == routed and rid in env.cluster.queue, a
