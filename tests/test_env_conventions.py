"""Python's and Gymnasium's calling conventions: keyword probing, vector envs, SB3's VecEnvs."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest

import llm_lb_gym  # noqa: F401
from llm_lb_gym._validate import ConfigError, UnknownOptionError
from llm_lb_gym.envs import LLMClusterEnv

SMALL = dict(num_instances=2, num_requests=25, arrival_rate_rps=10.0)
PYTHON_WORDING = re.compile(r"__init__\(\) got an unexpected keyword argument '(\w+)'")


def make_probing(env_fn, optional: dict, **required):
    """What generic wrappers do (Atari-style ``frameskip``, ``render_mode``): pass optional
    keywords, and on Python's unexpected-keyword TypeError retry without the one named."""
    optional = dict(optional)
    while True:
        try:
            return env_fn(**required, **optional)
        except TypeError as e:
            m = PYTHON_WORDING.match(str(e))
            if m is None or m.group(1) not in optional:
                raise
            del optional[m.group(1)]


def test_unknown_keyword_is_a_typeerror_worded_as_pythons():
    with pytest.raises(TypeError) as err:
        LLMClusterEnv(frameskip=4, **SMALL)
    assert isinstance(err.value, UnknownOptionError) and isinstance(err.value, ConfigError)
    msg = str(err.value)
    assert msg.startswith("__init__() got an unexpected keyword argument 'frameskip'; allowed: ")
    assert "num_instances" in msg and "render_mode" in msg
    # Python names the first unexpected keyword; the others follow.
    with pytest.raises(TypeError, match=r"^__init__\(\) got an unexpected keyword argument "
                                         r"'frameskip' \(and 'num_instance'\); allowed: action,"):
        LLMClusterEnv(frameskip=4, num_instance=3)


def test_gym_make_keeps_the_type_and_the_wording():
    with pytest.raises(UnknownOptionError) as err:
        gym.make("LLMCluster-v0", frameskip=4, **SMALL)
    assert str(err.value).startswith("__init__() got an unexpected keyword argument 'frameskip'")


def test_probing_wrappers_drop_unsupported_keywords_and_keep_supported_ones():
    env = make_probing(gym.make, {"frameskip": 4, "full_action_space": True,
                                  "render_mode": "ansi"}, id="LLMCluster-v0", **SMALL)
    assert env.unwrapped.render_mode == "ansi" and env.unwrapped.cfg.num_instances == 2
    env.reset(seed=0)
    assert "router queue" in env.render()


def test_probing_does_not_hide_a_typo():
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_instance'"):
        make_probing(LLMClusterEnv, {"frameskip": 4}, num_instance=2)


def test_nested_unknown_options_are_typeerrors_too():
    with pytest.raises(TypeError, match=r"unknown engine option\(s\): shceduler; allowed: "):
        LLMClusterEnv(engine={"shceduler": "fcfs"}, **SMALL)


def _rollout_vector(step_fn, reset_fn, num_envs: int, steps: int):
    """(obs, reward, terminated, metrics of the envs that ended) per step, actions fixed."""
    out = [reset_fn()]
    for t in range(steps):
        actions = np.array([(t + i) % 3 for i in range(num_envs)])
        out.append(step_fn(actions))
    return out


def _gym_vec(mode: str):
    env = gym.make_vec("LLMCluster-v0", num_envs=2, vectorization_mode=mode, **SMALL)

    def step(actions):
        obs, reward, terminated, truncated, info = env.step(actions)
        metrics = info.get("metrics", {})
        ended = [m for m in metrics.get("mean_e2e_s", [])[metrics["_mean_e2e_s"]]] if metrics else []
        return obs, reward, terminated, truncated, ended

    return env, step, lambda: env.reset(seed=[5, 6])[0]


def test_gym_make_vec_async_matches_sync():
    results, ends = {}, {}
    for mode in ("sync", "async"):
        env, step, reset = _gym_vec(mode)
        try:
            results[mode] = _rollout_vector(step, reset, 2, 90)
        finally:
            env.close()
        ends[mode] = sum(len(r[4]) for r in results[mode][1:])
    assert ends["sync"] >= 2          # each env finished an episode and was autoreset
    for s, a in zip(results["sync"], results["async"]):
        if isinstance(s, tuple):
            for x, y in zip(s, a):
                np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_array_equal(s, a)


def test_sb3_subproc_vec_env_matches_dummy():
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    # Workers start fresh interpreters: the "module:id" form makes gym.make import the package
    # (which registers the id) first, as Gymnasium documents for third-party envs.
    fns = [lambda: gym.make("llm_lb_gym:LLMCluster-v0", **SMALL) for _ in range(2)]
    results = {}
    for name, cls in (("dummy", DummyVecEnv), ("subproc", SubprocVecEnv)):
        venv = cls(fns)
        try:
            venv.seed(11)

            def step(actions):
                obs, reward, done, infos = venv.step(actions)
                ended = [i["metrics"]["mean_e2e_s"] for i in infos if "metrics" in i]
                # DummyVecEnv keeps rewards in a float32 buffer, SubprocVecEnv as given.
                return obs, reward.astype(np.float32), done, ended

            results[name] = _rollout_vector(step, venv.reset, 2, 90)
        finally:
            venv.close()
    assert sum(len(r[3]) for r in results["dummy"][1:]) >= 2
    for d, s in zip(results["dummy"], results["subproc"]):
        if isinstance(d, tuple):
            for x, y in zip(d, s):
                np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_array_equal(d, s)
