"""The late_binding tuning script runs on a composed experiment and prints paired changes."""

from __future__ import annotations

import re

from llm_lb_gym.experiments.tune_late_binding import main


def test_tuning_prints_a_paired_change_per_grid_point(capsys):
    main(["experiment=[paper_v100,debug]", "--seeds", "500", "--periods", "0,0.5", "--reserves", "prompt"])
    out = capsys.readouterr().out
    rows = re.findall(r"late_binding period_s=(\S+) reserve=prompt rounds=since_release: ([+-]\d+\.\d\d)%", out)
    assert [p for p, _ in rows] == ["0", "0.5"]
    assert "round_robin mean E2E per seed [500]" in out
