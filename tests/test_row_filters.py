"""Filters that remove trace rows say how many and why (issue 22, class 5): the workload's
``row_filters`` report, the line above evaluate's table (printed and in summary.md) and the
``row_filters`` entry of run.json."""

from __future__ import annotations

import json
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_lb_gym.experiments._hydra import CONF_DIR
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.data.traces import TraceFormatError
from llm_lb_gym.workload.filters import cap_rows
from llm_lb_gym.workload.trace_workload import TraceWorkload

EXAMPLES = int(os.environ.get("LLM_LB_GYM_HYPOTHESIS_EXAMPLES", "60"))
BURST = "tests/fixtures/traces/tiny_burstgpt.csv"


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), min_size=1, max_size=30),
       max_prompt=st.none() | st.integers(1, 60), max_context=st.none() | st.integers(2, 80))
def test_report_counts_every_removed_row_once_by_its_first_reason(tmp_path, rows, max_prompt,
                                                                  max_context):
    """BurstGPT (0 output tokens: dropped): counts checked row by row against the options."""
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens\n"
                    + "".join(f"{i},m,{p},{d}\n" for i, (p, d) in enumerate(rows)))
    want = {"zero_tokens": 0, "max_prompt_tokens": 0, "max_context_tokens": 0}
    clipped = 0
    for p, d in rows:
        if p == 0 or d == 0:
            want["zero_tokens"] += 1
        elif max_prompt is not None and p > max_prompt:
            want["max_prompt_tokens"] += 1
        elif max_context is not None and p >= max_context:
            want["max_context_tokens"] += 1
        elif max_context is not None and d > max_context - p:
            clipped += 1
    kept = len(rows) - sum(want.values())
    try:
        w = TraceWorkload(str(path), "burstgpt", max_prompt_tokens=max_prompt,
                          max_context_tokens=max_context)
    except (ConfigError, TraceFormatError) as err:   # nothing left: named, and only then
        assert kept == 0, err
        return
    r = w.row_filters
    assert r.rows_read == len(rows) and r.rows_kept == kept == len(w._rows.prompt_tokens)
    assert r.decode_clipped == clipped
    for reason, n in want.items():
        applies = {"zero_tokens": n > 0, "max_prompt_tokens": max_prompt is not None,
                   "max_context_tokens": max_context is not None}[reason]
        assert r.removed.get(reason, 0) == n and ((reason in r.removed) == applies)
    if r.rows_removed:
        assert f"filters removed {r.rows_removed:,} of {len(rows):,} rows" in r.describe()


def test_task_filter_counted_before_the_caps():
    prompt = np.array([5, 50, 50, 5])
    keep = np.array([False, True, False, True])   # task_filter removed rows 0 and 2
    keep, decode, r = cap_rows("c", prompt, np.array([9, 9, 9, 9]), keep, 10, None,
                               {"task_filter": 2}, {"task_filter": ["qa"]})
    assert keep.tolist() == [False, False, False, True]
    assert r.removed == {"task_filter": 2, "max_prompt_tokens": 1} and r.rows_kept == 1
    assert "2 of tasks outside task_filter=['qa']; 1 with prompt > max_prompt_tokens=10" in r.describe()


def test_evaluate_prints_and_records_the_filtered_rows(tmp_path, capsys):
    from hydra import compose, initialize_config_dir

    from llm_lb_gym.experiments.evaluate import evaluate

    overrides = ["workload=trace", f"workload.path={os.path.abspath(BURST)}",
                 "workload.format=burstgpt", "workload.max_context_tokens=1500",
                 "policies=[round_robin]", "episodes=1", "env.num_requests=5", "plot=false",
                 "progress=false"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=overrides)
    w = TraceWorkload(os.path.abspath(BURST), "burstgpt", max_context_tokens=1500)
    n = w.row_filters.removed["max_context_tokens"]
    assert n > 0
    res = evaluate(cfg, out=tmp_path)
    line = f"{n:,} with prompt >= max_context_tokens=1500 (no room to generate)"
    assert line in (tmp_path / "summary.md").read_text()
    assert line in capsys.readouterr().out
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["row_filters"]["removed"]["max_context_tokens"] == n
    assert record["row_filters"] == res["row_filters"] == w.row_filters.as_dict()
