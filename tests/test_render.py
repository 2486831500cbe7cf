"""``render_mode`` per Gymnasium: ``ansi`` and ``rgb_array`` views, None without a mode."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import llm_lb_gym  # noqa: F401
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs import LLMClusterEnv
from llm_lb_gym.envs.render import RENDER_MODES, RGB_SIZE_PX

# KV-starved so that preemptions show up within a few hundred steps.
SMALL = dict(num_instances=2, num_requests=120, arrival_rate_rps=40.0,
             engine={"num_kv_blocks": 60})


def _run(env, steps: int, seed: int = 0):
    obs, info = env.reset(seed=seed)
    for t in range(steps):
        obs, _, terminated, truncated, info = env.step(t % 2)
        if terminated or truncated:
            break
    return obs, info


def test_metadata_lists_the_supported_modes():
    assert LLMClusterEnv.metadata["render_modes"] == list(RENDER_MODES) == ["ansi", "rgb_array", "human"]
    assert LLMClusterEnv.metadata["render_fps"] > 0


def test_ansi_shows_router_queue_and_every_instance():
    env = gym.make("LLMCluster-v0", render_mode="ansi", **SMALL)
    _run(env, 150)
    text = env.render()
    assert isinstance(text, str)
    lines = text.splitlines()
    c = env.unwrapped.cluster
    assert lines[0].startswith(f"t={c.t:.3f} s  arrived {c.n_arrived}/120")
    assert lines[1].startswith(f"router queue {len(c.queue)} (")
    rows = lines[3:]
    assert len(rows) == 2
    for e, row in zip(c.engines, rows):
        cols = row.split()
        running, prefill, waiting = map(int, cols[1:4])
        assert (running, prefill, waiting) == (len(e.running), len(e.prefilling), e.num_waiting)
        pct = 100 * (e.total_blocks - e.free_blocks) / e.total_blocks
        assert cols[5] == f"{pct:.0f}%"
        assert (int(cols[6]), int(cols[7])) == (e.n_preemptions, e.n_finished)
    assert sum(e.n_preemptions for e in c.engines) > 0   # the KV shortage was visible


def test_ansi_at_the_end_of_an_episode():
    env = LLMClusterEnv(render_mode="ansi", **SMALL)
    _, info = _run(env, 100_000)
    assert info["metrics"] is not None
    lines = env.render().splitlines()
    assert lines[1] == "router queue 0 (empty)"
    done = info["metrics"]["completed"]
    assert lines[0] == (f"t={env.cluster.t:.3f} s  arrived 120/120  finished {done}  "
                        f"rejected {info['metrics']['rejected']}")
    assert all(row.split()[1:4] == ["0", "0", "0"] for row in lines[3:])


def test_rgb_array_is_an_image_and_changes_with_the_state():
    env = gym.make("LLMCluster-v0", render_mode="rgb_array", **SMALL)
    env.reset(seed=0)
    first = env.render()
    assert first.dtype == np.uint8 and first.shape == (RGB_SIZE_PX[1], RGB_SIZE_PX[0], 3)
    assert first.min() < 128 < first.max()     # something is drawn on the white canvas
    _run(env, 150)
    later = env.render()
    assert later.shape == first.shape and not np.array_equal(first, later)


def test_rendering_does_not_change_the_episode():
    plain = LLMClusterEnv(**SMALL)
    drawn = LLMClusterEnv(render_mode="ansi", **SMALL)
    for env in (plain, drawn):
        env.reset(seed=3)
    for t in range(200):
        drawn.render()
        a = plain.step(t % 3)
        b = drawn.step(t % 3)
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1:4] == b[1:4]
        if a[2]:
            break
    assert plain.metrics() == drawn.metrics()


def test_no_render_mode_returns_none_with_gymnasiums_warning():
    env = gym.make("LLMCluster-v0", **SMALL)
    env.reset(seed=0)
    with pytest.warns(UserWarning, match="without specifying any render mode"):
        assert env.render() is None


def test_invalid_render_mode_names_the_allowed_values():
    with pytest.raises(ConfigError, match=r"render_mode='window' is not valid; allowed: None, ansi, rgb_array, human"):
        LLMClusterEnv(render_mode="window", **SMALL)
    with pytest.raises(ConfigError, match=r"render_mode='text' is not valid"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # gym.make warns first that the mode is unknown
            gym.make("LLMCluster-v0", render_mode="text", **SMALL)


def test_render_before_reset_is_an_error():
    with pytest.raises(RuntimeError, match=r"render\(\) before reset\(\)"):
        LLMClusterEnv(render_mode="ansi", **SMALL).render()


def test_rgb_array_list_collects_frames():
    """Gymnasium's ``*_list`` modes wrap a declared mode in RenderCollection."""
    env = gym.make("LLMCluster-v0", render_mode="ansi_list", **SMALL)
    _run(env, 3)
    frames = env.render()
    assert len(frames) == 4 and all(isinstance(f, str) for f in frames)


@pytest.mark.parametrize("mode", RENDER_MODES)
def test_check_env_with_render_checks_and_warnings_as_errors(mode):
    env = gym.make("LLMCluster-v0", render_mode=mode, **SMALL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


def test_human_prints_the_text_table_each_step_without_pygame(capsys, monkeypatch):
    """gym.make(render_mode="human") used to wrap the env in HumanRendering, which failed with
    pygame's import error; the env now renders "human" itself, as text on stdout."""
    import builtins

    real_import = builtins.__import__

    def no_pygame(name, *args, **kwargs):
        if name.split(".")[0] == "pygame":
            raise ImportError("No module named 'pygame'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pygame)
    env = gym.make("LLMCluster-v0", render_mode="human", **SMALL)
    assert env.unwrapped.render_mode == "human"
    env.reset(seed=0)
    env.step(0)
    env.step(1)
    out = capsys.readouterr().out
    assert out.count("router queue") == 3 and out.startswith("t=0.000 s  arrived")
    assert env.render() is None and capsys.readouterr().out == ""
    ansi = LLMClusterEnv(render_mode="ansi", **SMALL)
    ansi.reset(seed=0)
    assert ansi.render() in out   # the same table as ansi's
