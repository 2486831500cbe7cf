"""The soak benchmark's command runs and checks accounting at every episode end (smoke size)."""

from __future__ import annotations

from llm_lb_gym.experiments.soak import main, soak


def test_soak_smoke_with_truncations(capsys):
    r = soak(3000, seed=1, max_episode_steps=40, num_requests=80)
    assert r["steps"] == 3000 and r["episodes_truncated"] > 0
    assert r["requests_unfinished"] > 0
    total = r["requests_completed"] + r["requests_rejected"] + r["requests_unfinished"]
    assert total == 80 * r["episodes_finished"]
    main(["--steps", "500", "--num-requests", "30"])
    assert "rss_end_mib" in capsys.readouterr().out


def test_soak_smoke_with_prefix_caching_and_candidates(capsys):
    """Caching on (conversation workload, hash chains) and 3 candidates: every terminated
    episode leaves the KV accounting at rest (soak raises otherwise), and the cache is used."""
    from llm_lb_gym.experiments.soak import soak_options

    opts = soak_options(60, prefix_caching=True, candidates=3)
    r = soak(3000, seed=2, max_episode_steps=500, **opts)
    assert r["steps"] == 3000 and r["episodes_finished"] > 0
    total = r["requests_completed"] + r["requests_rejected"] + r["requests_unfinished"]
    assert total == 60 * r["episodes_finished"]
    assert r["prefill_tokens_saved_by_cache"] > 0
    main(["--steps", "300", "--num-requests", "20", "--prefix-caching", "--candidates", "2"])
    out = capsys.readouterr().out
    assert "'candidates': 2" in out and "enable_prefix_caching" in out


def test_soak_kv_check_notices_a_block_left_in_use():
    import gymnasium as gym
    import pytest

    from llm_lb_gym.experiments.soak import _kv_at_rest

    env = gym.make("LLMCluster-v0", num_requests=5)
    env.reset(seed=0)
    e = env.unwrapped.cluster.engines[0]
    e._sync_used()
    e.used += 1
    with pytest.raises(AssertionError, match="KV not at rest"):
        _kv_at_rest(env, 0)
