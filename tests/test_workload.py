"""Workloads: arrival processes, the paper's task mix, trace readers and the registry."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.workload import (PAPER_TASKS, DeterministicArrivals, GammaArrivals,
                                 PoissonArrivals, RequestBatch, TaskMixWorkload, TaskSpec,
                                 TraceArrivals, TraceFormatError, TraceWorkload,
                                 arrival_process, default_data_dir, fit_spliced, load_trace,
                                 make_workload, read_trace)

TRACES = default_data_dir() / "traces"
REAL_FILES = {
    "azure_conv": ("azure_llm_2023_conv.csv", "azure", 19366),
    "sharegpt": ("sharegpt_lengths_llama2_tokenizer.csv", "lengths", 30731),
    "arxiv_summarization": ("arxiv_summarization_lengths_llama2_tokenizer.csv", "lengths", 28257),
}


def _same_batch(a: RequestBatch, b: RequestBatch) -> bool:
    return (a.arrival_s.tobytes() == b.arrival_s.tobytes()
            and np.array_equal(a.prompt_tokens, b.prompt_tokens)
            and np.array_equal(a.decode_tokens, b.decode_tokens)
            and np.array_equal(a.task_id, b.task_id) and a.task_names == b.task_names)


@pytest.fixture(scope="module")
def task_mix() -> TaskMixWorkload:
    return TaskMixWorkload()


@pytest.fixture(scope="module")
def big_mix_batch(task_mix) -> RequestBatch:
    return task_mix.sample(np.random.default_rng(2024), 100_000)


# -- arrival processes --------------------------------------------------------------------------
def test_poisson_rate_and_memorylessness():
    t = PoissonArrivals(20.0).times_s(np.random.default_rng(1), 20_001)
    gaps = np.diff(t)
    assert t[0] == 0.0 and np.all(gaps >= 0)
    assert 1.0 / gaps.mean() == pytest.approx(20.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_rate_and_cv(cv):
    gaps = np.diff(GammaArrivals(10.0, cv).times_s(np.random.default_rng(2), 100_001))
    assert 1.0 / gaps.mean() == pytest.approx(10.0, rel=0.04)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)


def test_deterministic_arrivals_are_evenly_spaced():
    t = DeterministicArrivals(4.0).times_s(np.random.default_rng(0), 5)
    np.testing.assert_allclose(t, [0.0, 0.25, 0.5, 0.75, 1.0])


@pytest.mark.parametrize("make", [lambda: PoissonArrivals(-1.0), lambda: GammaArrivals(0.0, 1.0),
                                  lambda: DeterministicArrivals(-3)])
def test_bad_rate_names_option_and_range(make):
    with pytest.raises(ConfigError, match=r"rate_rps=.*out of range; allowed: \[1e-09, inf\)"):
        make()


def test_bad_cv_is_rejected():
    with pytest.raises(ConfigError, match="cv="):
        GammaArrivals(5.0, -1.0)


def test_trace_arrivals_rate_scale_and_wrap():
    ts = np.array([100.0, 101.0, 103.0, 106.0])
    rng = np.random.default_rng(0)
    np.testing.assert_allclose(TraceArrivals(ts, 2.0, "head").times_s(rng, 4), [0, 0.5, 1.5, 3.0])
    # Wrapping: a periodic extension whose seam is one mean gap (span 6 s / 3 gaps = 2 s).
    np.testing.assert_allclose(TraceArrivals(ts, 1.0, "head").times_s(rng, 6),
                               [0, 1, 3, 6, 8, 9])
    with pytest.raises(ConfigError, match="non-decreasing"):
        TraceArrivals(np.array([2.0, 1.0]))


# -- length distributions and the task mix ------------------------------------------------------
def test_spliced_fit_matches_mean_and_share_exactly():
    d = fit_spliced(142.53, 0.4101, 300, 4095)
    assert d.mean() == pytest.approx(142.53, abs=1e-4)
    assert d.share_at_least(300) == pytest.approx(0.4101, abs=1e-9)
    assert d.pmf().sum() == pytest.approx(1.0, abs=1e-9)


def test_unreachable_table_row_is_a_config_error():
    with pytest.raises(ConfigError, match="mean_tokens"):
        fit_spliced(380.0, 0.5818, 150, 399)


def test_task_mix_matches_table_1(task_mix, big_mix_batch):
    b = big_mix_batch
    assert b.task_names == ("translation", "qna", "sentiment", "context_qna",
                            "entity_recognition")
    for j, spec in enumerate(PAPER_TASKS):
        rows = b.task_id == j
        assert rows.mean() == pytest.approx(0.2, abs=0.01)  # uniform over tasks
        assert b.prompt_tokens[rows].mean() == pytest.approx(spec.mean_prompt_tokens, rel=0.03)
        assert b.decode_tokens[rows].mean() == pytest.approx(spec.mean_decode_tokens, rel=0.04)
        heavy = np.mean(b.decode_tokens[rows] >= task_mix.heavy_decode_tokens)
        assert heavy == pytest.approx(spec.heavy_decode_share, abs=0.015)


def test_task_mix_respects_caps(big_mix_batch):
    b = big_mix_batch
    assert b.prompt_tokens.min() >= 1 and b.prompt_tokens.max() <= 1000
    assert (b.prompt_tokens + b.decode_tokens).max() <= 4096
    assert (b.prompt_tokens + b.decode_tokens).max() == 4096  # the clip is reached, not avoided


def test_small_caps_and_custom_task():
    spec = TaskSpec("toy", "test", 10, 50.0, 80.0, 0.1, 0.5, "test")
    w = TaskMixWorkload(arrivals=DeterministicArrivals(10.0), max_prompt_tokens=60,
                        max_context_tokens=200, heavy_decode_tokens=120, tasks=(spec,))
    b = w.sample(np.random.default_rng(0), 20_000)
    assert b.prompt_tokens.max() <= 60 and (b.prompt_tokens + b.decode_tokens).max() <= 200
    assert b.task_names == ("toy",)


def test_task_mix_weights():
    w = TaskMixWorkload(weights="samples")
    counts = np.array([t.samples for t in PAPER_TASKS], float)
    np.testing.assert_allclose(w.weights, counts / counts.sum())
    only = TaskMixWorkload(weights={"qna": 1.0})
    assert np.all(only.sample(np.random.default_rng(0), 500).task_id == 1)
    with pytest.raises(ConfigError, match="weights has 2 entries"):
        TaskMixWorkload(weights=(1.0, 2.0))
    with pytest.raises(ConfigError, match="unknown task weight option"):
        TaskMixWorkload(weights={"chat": 1.0})
    with pytest.raises(ConfigError, match=r"weights\[qna\]"):
        TaskMixWorkload(weights=(1, -1, 1, 1, 1))


def test_task_mix_is_deterministic(task_mix):
    a = task_mix.sample(np.random.default_rng(7), 2000)
    b = task_mix.sample(np.random.default_rng(7), 2000)
    c = task_mix.sample(np.random.default_rng(8), 2000)
    assert _same_batch(a, b) and not _same_batch(a, c)
    assert a.arrival_s[0] == 0.0 and len(a) == 2000


# -- trace readers ------------------------------------------------------------------------------
def _write(path, text: str):
    path.write_text(text)
    return path


AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.6805900,374,44\n"
         "2023-11-16 18:15:48.1805900,12,7\n"
         "2023-11-16 18:15:47.1805900,396,109\n")


def test_azure_reader_sorts_and_converts(tmp_path):
    d = read_trace(_write(tmp_path / "az.csv", AZURE), "azure")
    np.testing.assert_allclose(d.arrival_s, [0.0, 0.5, 1.5])
    np.testing.assert_array_equal(d.prompt_tokens, [374, 396, 12])
    np.testing.assert_array_equal(d.decode_tokens, [44, 109, 7])
    np.testing.assert_array_equal(d.line, [2, 4, 3])


def test_lengths_reader_ignores_other_columns(tmp_path):
    p = _write(tmp_path / "len.csv", "num_prefill_tokens,num_decode_tokens,pd_ratio\n"
                                     "10,5,2.0\n\n20,4,5.0\n")
    d = read_trace(p, "lengths")
    assert d.arrival_s is None and d.task_names == ("len",)
    np.testing.assert_array_equal(d.prompt_tokens, [10, 20])
    np.testing.assert_array_equal(d.line, [2, 4])


def test_mooncake_reader_converts_ms(tmp_path):
    rows = [{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [1, 2]},
            {"timestamp": 1500, "input_length": 100, "output_length": 3}]
    p = _write(tmp_path / "mc.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    d = read_trace(p, "mooncake")
    np.testing.assert_allclose(d.arrival_s, [0.0, 1.5])
    np.testing.assert_array_equal(d.decode_tokens, [52, 3])


BURST = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
         "5,ChatGPT,472,18,490,Conversation log\n"
         "7,GPT-4,1087,0,1087,Conversation log\n"
         "9.5,GPT-4,300,100,400,API log\n")


def test_burstgpt_reader_models_are_tasks_and_failures_dropped(tmp_path):
    d = read_trace(_write(tmp_path / "bg.csv", BURST), "burstgpt")
    assert d.task_names == ("ChatGPT", "GPT-4") and d.dropped_zero_rows == 1
    np.testing.assert_array_equal(d.task_id, [0, 1])
    np.testing.assert_allclose(d.arrival_s, [0.0, 4.5])
    with pytest.raises(TraceFormatError, match="zero_tokens='drop'"):
        read_trace(tmp_path / "bg.csv", "burstgpt", zero_tokens="error")


MALFORMED = [
    ("azure", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,3\n", 1, "GeneratedTokens"),
    ("azure", AZURE + "2023-11-16 18:15:49.0,12,x7\n", 5, "GeneratedTokens"),
    ("azure", AZURE + "2023-11-16 18:15:49.0,-12,7\n", 5, "ContextTokens"),
    ("azure", AZURE + "2023-11-16 18:15:49.0,0,7\n", 5, "ContextTokens"),
    ("azure", AZURE + "2023-11-16 18:15:49.0,12,0\n", 5, "GeneratedTokens"),
    ("azure", AZURE + "2023-11-16 18:61:49.0,12,7\n", 5, "TIMESTAMP"),
    ("azure", AZURE + "yesterday,12,7\n", 5, "TIMESTAMP"),
    ("azure", AZURE + "2023-11-16 18:15:49.0,12\n", 5, "GeneratedTokens"),
    ("lengths", "num_prefill_tokens,num_decode_tokens\n10,5\n10,2.5\n", 3, "num_decode_tokens"),
    ("lengths", "num_prefill_tokens,num_decode_tokens\n10,5\n,5\n", 3, "num_prefill_tokens"),
    ("lengths", "num_prefill_tokens,num_decode_tokens\n10,nan\n", 2, "num_decode_tokens"),
    ("burstgpt", BURST + "soon,GPT-4,3,4,7,API log\n", 5, "Timestamp"),
    ("burstgpt", BURST + "12,,3,4,7,API log\n", 5, "Model"),
    ("mooncake", '{"timestamp": 1, "input_length": 5, "output_length": 2}\n{"timestamp": 2,'
                 ' "input_length": 5}\n', 2, "output_length"),
    ("mooncake", '{"timestamp": 1, "input_length": 5, "output_length": 2}\n'
                 '{"timestamp": "x", "input_length": 5, "output_length": 2}\n', 2, "timestamp"),
    ("mooncake", '{"timestamp": 1, "input_length": 5, "output_length": 2}\n{oops\n', 2,
     "(whole line)"),
]


@pytest.mark.parametrize("format,text,line,column", MALFORMED)
def test_malformed_file_error_names_file_line_column(tmp_path, format, text, line, column):
    path = _write(tmp_path / f"bad.{format}", text)
    with pytest.raises(TraceFormatError) as info:
        read_trace(path, format)
    message = str(info.value)
    assert str(path) in message and f"line {line}," in message and repr(column) in message
    assert (info.value.line, info.value.column) == (line, column)


def test_missing_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        read_trace(tmp_path / "nope.csv", "azure")
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        make_workload("trace", path=tmp_path / "nope.csv", format="azure")


# -- trace workloads ----------------------------------------------------------------------------
def _azure_file(tmp_path, n: int = 50):
    rng = np.random.default_rng(3)
    gaps = rng.exponential(0.5, n)
    base = np.datetime64("2023-11-16T18:00:00", "ns")
    stamps = base + (np.cumsum(gaps) * 1e9).astype("timedelta64[ns]")
    rows = [f"{str(s).replace('T', ' ')[:27]},{p},{d}" for s, p, d in
            zip(stamps, rng.integers(1, 3000, n), rng.integers(1, 500, n))]
    return _write(tmp_path / "azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  + "\n".join(rows) + "\n")


def test_rate_scale_halves_the_span(tmp_path):
    path = _azure_file(tmp_path)
    slow = TraceWorkload(path, "azure", start="head").sample(np.random.default_rng(0), 40)
    fast = TraceWorkload(path, "azure", start="head", rate_scale=2.0).sample(
        np.random.default_rng(0), 40)
    assert fast.arrival_s[-1] == pytest.approx(slow.arrival_s[-1] / 2, rel=1e-12)
    np.testing.assert_array_equal(fast.prompt_tokens, slow.prompt_tokens)


def test_trace_window_random_start_wrap_and_determinism(tmp_path):
    w = TraceWorkload(_azure_file(tmp_path), "azure")
    data = w.data
    a, b = (w.sample(np.random.default_rng(5), 30) for _ in range(2))
    assert _same_batch(a, b)
    first = a.meta["first_row"]
    np.testing.assert_array_equal(a.prompt_tokens, data.prompt_tokens[first:first + 30])
    np.testing.assert_allclose(a.arrival_s, data.arrival_s[first:first + 30]
                               - data.arrival_s[first])
    long = w.sample(np.random.default_rng(5), 120)  # more than 50 rows: wraps around
    assert long.meta["wrapped"] and len(long) == 120 and np.all(np.diff(long.arrival_s) >= 0)


def test_trace_caps_filter_prompts_and_clip_decode(tmp_path):
    w = TraceWorkload(_azure_file(tmp_path), "azure", start="head", max_prompt_tokens=1000,
                      max_context_tokens=1200)
    b = w.sample(np.random.default_rng(0), 200)
    keep = w.data.prompt_tokens <= 1000
    assert b.meta["filtered_rows"] == int((~keep).sum()) > 0
    assert b.prompt_tokens.max() <= 1000 and (b.prompt_tokens + b.decode_tokens).max() <= 1200


def test_length_only_rows_and_arrivals(tmp_path):
    p = _write(tmp_path / "len.csv", "num_prefill_tokens,num_decode_tokens\n"
               + "".join(f"{i + 1},{2 * i + 1}\n" for i in range(10)))
    with pytest.raises(ConfigError, match="has no timestamps"):
        TraceWorkload(p, "lengths")
    w = TraceWorkload(p, "lengths", arrivals=DeterministicArrivals(2.0))
    b = w.sample(np.random.default_rng(1), 10)
    assert sorted(b.prompt_tokens) == list(range(1, 11))  # distinct rows
    np.testing.assert_array_equal(b.decode_tokens, 2 * b.prompt_tokens - 1)
    np.testing.assert_allclose(b.arrival_s, np.arange(10) / 2.0)
    cyc = w.sample(np.random.default_rng(1), 25)
    # Two full permutations, then 5 rows of a third: every row twice, five of them thrice.
    assert sorted(np.bincount(cyc.prompt_tokens)[1:]) == [2] * 5 + [3] * 5
    with pytest.raises(ConfigError, match="rate_scale"):
        TraceWorkload(p, "lengths", arrivals=PoissonArrivals(1.0), rate_scale=2.0)


def test_parse_cache_returns_the_same_object(tmp_path):
    path = _azure_file(tmp_path)
    assert load_trace(path, "azure") is load_trace(path, "azure")


# -- registry -----------------------------------------------------------------------------------
def test_registry_errors_list_valid_names():
    with pytest.raises(ConfigError, match="allowed: .*azure_conv.*task_mix"):
        make_workload("azure")
    with pytest.raises(ConfigError, match="unknown task_mix option.*: rate"):
        make_workload("task_mix", rate=3.0)
    with pytest.raises(ConfigError, match="allowed: deterministic, gamma, poisson"):
        arrival_process("bursty")
    with pytest.raises(ConfigError, match="unknown poisson arrival option"):
        arrival_process("poisson", rate_rps=1.0, cv=2.0)
    with pytest.raises(ConfigError, match="either arrivals or rate_rps"):
        make_workload("task_mix", arrivals=PoissonArrivals(1.0), rate_rps=3.0)
    with pytest.raises(ConfigError, match="needs path"):
        make_workload("burstgpt")


def test_registry_builds_arrivals():
    w = make_workload("task_mix", arrival="gamma", rate_rps=5.0, cv=2.0)
    assert w.arrivals == GammaArrivals(5.0, 2.0)
    assert make_workload("task_mix", arrivals={"kind": "deterministic", "rate_rps": 2.0}
                         ).arrivals == DeterministicArrivals(2.0)


def test_missing_default_data_says_where_and_how(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_LB_GYM_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}.*LLM_LB_GYM_DATA"):
        make_workload("azure_conv")


def test_registry_trace_with_burstgpt_file(tmp_path):
    w = make_workload("burstgpt", path=_write(tmp_path / "bg.csv", BURST), start="head")
    b = w.sample(np.random.default_rng(0), 2)
    assert b.task_names == ("ChatGPT", "GPT-4") and b.meta["dropped_zero_rows"] == 1


# -- the real shared traces ---------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(REAL_FILES))
def test_real_trace_parses(name):
    file, format, rows = REAL_FILES[name]
    if not (TRACES / file).is_file():
        pytest.skip(f"shared data absent: {TRACES / file} (set LLM_LB_GYM_DATA)")
    w = make_workload(name)
    data = w.data
    assert len(data) == rows and data.dropped_zero_rows == 0
    assert data.prompt_tokens.min() >= 1 and data.decode_tokens.min() >= 1
    if format == "azure":
        assert np.all(np.diff(data.line) > 0)  # the file is already in time order
        assert 4.0 < data.mean_rate_rps < 7.0
    b = w.sample(np.random.default_rng(0), 2000)
    assert len(b) == 2000 and b.task_names == (name,)
    assert _same_batch(b, w.sample(np.random.default_rng(0), 2000))


def test_changing_one_task_leaves_the_others_requests_alone():
    a = TaskSpec("a", "test", 10, 20.0, 40.0, 0.1, 0.5, "test")
    b1 = TaskSpec("b", "test", 10, 30.0, 90.0, 0.3, 0.5, "test")
    b2 = TaskSpec("b", "test", 10, 60.0, 50.0, 0.2, 0.9, "test")
    kw = dict(max_prompt_tokens=200, max_context_tokens=1000, heavy_decode_tokens=100)
    x = TaskMixWorkload(tasks=(a, b1), **kw).sample(np.random.default_rng(4), 500)
    y = TaskMixWorkload(tasks=(a, b2), **kw).sample(np.random.default_rng(4), 500)
    rows = x.task_id == 0
    np.testing.assert_array_equal(x.task_id, y.task_id)
    np.testing.assert_array_equal(x.decode_tokens[rows], y.decode_tokens[rows])
    assert not np.array_equal(x.decode_tokens[~rows], y.decode_tokens[~rows])


def test_workloads_pickle_and_deepcopy(task_mix, tmp_path):
    import copy
    import pickle

    trace = TraceWorkload(_azure_file(tmp_path), "azure")
    for w in (task_mix, trace):
        for clone in (pickle.loads(pickle.dumps(w)), copy.deepcopy(w)):
            assert _same_batch(clone.sample(np.random.default_rng(1), 20),
                               w.sample(np.random.default_rng(1), 20))
