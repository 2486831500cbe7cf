"""The text workload: real prompts with their response lengths, split like the predictor's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.data import default_corpus_path, read_corpus
from llm_lb_gym.workload.arrivals import DeterministicArrivals, PoissonArrivals
from llm_lb_gym.workload.corpus import CorpusWorkload


@pytest.fixture
def corpus_file(tmp_path):
    rows = []
    for i in range(300):
        task = ["chat", "math", "qa"][i % 3]
        rows.append({"prompt": f"{task} prompt number {i // 2}", "task_type": task,
                     "response_tokens_wordpiece": i % 50, "prompt_tokens_wordpiece": 5 + i % 40})
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_sample_carries_text_tokens_and_tasks(corpus_file):
    w = CorpusWorkload(path=str(corpus_file), arrivals=PoissonArrivals(10.0), split="all")
    b = w.sample(np.random.default_rng(0), 100)
    assert len(b) == 100 and b.texts is not None
    assert b.task_names == ("chat", "math", "qa")
    rows = {r["prompt"]: r for r in map(json.loads, corpus_file.read_text().splitlines())}
    for text, p, d, t in zip(b.texts, b.prompt_tokens, b.decode_tokens, b.task_id):
        r = rows[text]
        assert p == r["prompt_tokens_wordpiece"]
        assert d == max(1, r["response_tokens_wordpiece"])  # 0-token responses become 1
        assert b.task_names[t] == r["task_type"]
    assert len(set(b.texts)) > 60  # rows drawn without replacement (prompts repeat twice)


def test_sampling_is_seeded_and_split_matches_predictor(corpus_file):
    w = CorpusWorkload(path=str(corpus_file), arrivals=DeterministicArrivals(5.0))
    a, b = w.sample(np.random.default_rng(3), 40), w.sample(np.random.default_rng(3), 40)
    assert a.texts == b.texts and np.array_equal(a.decode_tokens, b.decode_tokens)
    assert np.allclose(a.arrival_s, np.arange(40) / 5.0)
    test_prompts = set(read_corpus(corpus_file).split("test", 0.2).prompts)
    assert set(a.texts) <= test_prompts
    big = w.sample(np.random.default_rng(0), 5 * len(test_prompts))  # more than the split: cycles
    assert set(big.texts) == test_prompts


def test_filters_and_errors(corpus_file):
    w = CorpusWorkload(path=str(corpus_file), task_filter=("math",), split="train", max_prompt_tokens=20)
    b = w.sample(np.random.default_rng(0), 30)
    assert w.task_names == ("math",) and set(b.task_id) == {0} and b.prompt_tokens.max() <= 20
    capped = CorpusWorkload(path=str(corpus_file), split="all", max_context_tokens=30)
    b = capped.sample(np.random.default_rng(0), 200)
    assert np.all(b.prompt_tokens + b.decode_tokens <= 30)
    with pytest.raises(ConfigError, match="task_filter has unknown task.*coding; allowed: chat, math, qa"):
        CorpusWorkload(path=str(corpus_file), task_filter=("coding",))
    with pytest.raises(ConfigError, match="split='val' is not valid"):
        CorpusWorkload(path=str(corpus_file), split="val")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        CorpusWorkload(path=str(corpus_file.parent / "nope.jsonl"))


def test_shared_corpus_workload():
    path = default_corpus_path()
    if not path.is_file():
        pytest.skip(f"shared corpus not found at {path} (set LLM_LB_GYM_DATA)")
    w = CorpusWorkload(max_prompt_tokens=1000)
    b = w.sample(np.random.default_rng(0), 2000)
    assert len(b.task_names) == 11 and b.prompt_tokens.max() <= 1000
    assert b.texts is not None and all(b.texts)


def test_corpus_is_a_registered_workload_and_runs_in_the_env(corpus_file):
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401
    from llm_lb_gym.workload.registry import make_workload

    w = make_workload("corpus", path=str(corpus_file), split="all", rate_rps=5.0)
    assert isinstance(w, CorpusWorkload) and w.arrivals == PoissonArrivals(5.0)
    with pytest.raises(ConfigError, match="unknown corpus option"):
        make_workload("corpus", path=str(corpus_file), splitt="all")
    env = gym.make("LLMCluster-v0", workload={"name": "corpus", "path": str(corpus_file), "split": "all"},
                   num_requests=40, arrival_rate_rps=7.0)
    assert env.unwrapped.workload.arrivals == PoissonArrivals(7.0)   # the env's rate drives it
    env.reset(seed=0)
    done = False
    while not done:
        _, _, done, trunc, info = env.step(0)
    assert info["metrics"]["completed"] + info["metrics"]["rejected"] == 40
