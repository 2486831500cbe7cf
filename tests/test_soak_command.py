"""The soak benchmark's command runs and checks accounting at every episode end (smoke size)."""

from __future__ import annotations

from experiments.soak import main, soak


def test_soak_smoke_with_truncations(capsys):
    r = soak(3000, seed=1, max_episode_steps=40, num_requests=80)
    assert r["steps"] == 3000 and r["episodes_truncated"] > 0
    assert r["requests_unfinished"] > 0
    total = r["requests_completed"] + r["requests_rejected"] + r["requests_unfinished"]
    assert total == 80 * r["episodes_finished"]
    main(["--steps", "500", "--num-requests", "30"])
    assert "rss_end_mib" in capsys.readouterr().out
