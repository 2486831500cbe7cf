"""Light and forest bucket predictors: they learn, save, reload and predict alike (the
transformer: test_predictor_transformer.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.data import read_corpus
from llm_lb_gym.predictor.base import LengthPredictor
from llm_lb_gym.predictor.buckets import SCHEMES
from llm_lb_gym.predictor.card import ModelCard, add_task_hint
from llm_lb_gym.predictor.forest import ForestPredictor, ForestSettings
from llm_lb_gym.predictor.metrics import scores
from llm_lb_gym.predictor.registry import make_predictor
from llm_lb_gym.predictor.task_classifier import TaskClassifier
from llm_lb_gym.predictor.text_predictor import TextBucketPredictor
from llm_lb_gym.workload.batch import RequestBatch

# (task, prompt template, decode tokens): the keyword decides the time4 bucket.
PATTERNS = [
    ("qa", "answer yes or no briefly question {i}", 5),
    ("chat", "explain in a few sentences what item {i} does", 60),
    ("chat", "write a very long detailed essay about subject {i}", 400),
    ("math", "solve this arithmetic problem step by step number {i}", 150),
]


def write_toy_corpus(path, n_per=40):
    with open(path, "w") as fh:
        for i in range(n_per):
            for task, tmpl, d in PATTERNS:
                prompt = tmpl.format(i=i)
                fh.write(json.dumps({"prompt": prompt, "task_type": task, "response_tokens_wordpiece": d + i % 7,
                                     "prompt_tokens_wordpiece": len(prompt.split()) + 2}) + "\n")
    return path


@pytest.fixture
def toy(tmp_path):
    return read_corpus(write_toy_corpus(tmp_path / "toy.jsonl"))


def _batch(corpus, with_text=True):
    n = len(corpus)
    names = corpus.task_names
    return RequestBatch.from_arrays(np.arange(n) * 0.1, corpus.prompt_tokens, np.maximum(corpus.decode_tokens, 1),
                                    [names.index(t) for t in corpus.task_types], names,
                                    texts=list(corpus.prompts) if with_text else None)


def test_task_hint_is_prepended():
    assert add_task_hint(["2+2?"], ["math"]) == ["This is a math task. 2+2?"]
    with pytest.raises(ValueError):
        add_task_hint(["a", "b"], ["math"])


def test_light_learns_saves_and_reloads(toy, tmp_path):
    scheme = SCHEMES["time4"]()
    train, test = toy.split("train", 0.3), toy.split("test", 0.3)
    model = TextBucketPredictor.fit(train, "light", scheme, {"n_features_log2": 12}, task_hint=True)
    pred = model.predict_buckets(test.prompts, test.task_types)
    assert scores(scheme.bucket(test.decode_tokens), pred, 4)["accuracy"] > 0.9
    model.save(tmp_path / "light", metrics={"accuracy": 1.0})
    again = make_predictor("light", path=str(tmp_path / "light"))
    assert isinstance(again, LengthPredictor) and again.scheme == scheme
    out = again.predict(_batch(test), np.random.default_rng(0))
    assert np.array_equal(out.bucket, pred)
    assert np.array_equal(out.tokens, np.asarray(model.card.bucket_mean_tokens)[pred])
    with pytest.raises(ConfigError, match="needs prompt texts.*RequestBatch.texts is None"):
        again.predict(_batch(test, with_text=False), np.random.default_rng(0))
    with pytest.raises(ConfigError, match="holds a light bucket model; expected a transformer bucket model"):
        make_predictor("transformer", path=str(tmp_path / "light"))


def test_murmur3_spans_match_scikit_learn():
    from sklearn.utils.murmurhash import murmurhash3_32

    from llm_lb_gym.predictor.hashed_ngrams import murmur3_spans

    rng = np.random.default_rng(0)
    keys = [bytes(rng.integers(0, 256, n).astype(np.uint8)) for n in rng.integers(0, 70, 3000)]
    lengths = np.array([len(k) for k in keys])
    starts = np.cumsum(lengths) - lengths
    got = murmur3_spans(b"".join(keys), starts, lengths)
    assert np.array_equal(got, [murmurhash3_32(k, positive=False) for k in keys])


def test_light_vectorised_inference_matches_the_pipeline():
    from llm_lb_gym.predictor.light import LightSettings, LightTextModel

    rng = np.random.default_rng(0)
    words = ["ans", "Yes", "no", "essay", "über", "naïve", "日本語", "слово", "x_1", "42", "a-b", "C++",
             "e.g.", "\t", "ÉCOLE", "ǅ", "ﬁne", "İ", "é"]
    texts = [" ".join(rng.choice(words, rng.integers(0, 30))) for _ in range(400)] + ["", "   ", "!!"]
    labels = rng.integers(0, 4, len(texts))
    # 2**10 columns: many hash collisions, which the pipeline sums
    model = LightTextModel.fit(texts, labels, 4, LightSettings(n_features_log2=10, ngram_max=3))
    assert model._fast is not None
    want = model.pipeline.predict_proba(model._prep(texts))
    got = model.predict_proba(texts)
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))
    assert np.allclose(got, want, atol=1e-5)


def test_task_classifier_and_predicted_hint(toy, tmp_path):
    train, test = toy.split("train", 0.3), toy.split("test", 0.3)
    clf = TaskClassifier.fit(train, "light", {"n_features_log2": 12})
    acc = np.mean([p == t for p, t in zip(clf.predict(test.prompts), test.task_types)])
    assert acc > 0.9
    model = TextBucketPredictor.fit(train, "light", SCHEMES["time4"](), {"n_features_log2": 12})
    model.save(tmp_path / "m")
    clf.save(tmp_path / "m" / "task_classifier")
    routed = make_predictor("light", path=str(tmp_path / "m"), task_source="classifier")
    assert np.array_equal(routed.predict_buckets(test.prompts), model.predict_buckets(test.prompts, test.task_types))
    with pytest.raises(ConfigError, match="task_source='guess' is not valid; allowed: batch, classifier"):
        make_predictor("light", path=str(tmp_path / "m"), task_source="guess")


def test_forest_uses_prompt_length_and_task(tmp_path):
    rng = np.random.default_rng(0)
    n = 600
    prompt = rng.integers(1, 400, size=n)
    tasks = rng.choice(["a", "b"], size=n)
    decode = np.where(prompt < 100, 10, np.where(tasks == "a", 80, 500))  # buckets 0, 1, 3
    lines = [json.dumps({"prompt": f"p{i}", "task_type": str(t), "response_tokens_wordpiece": int(d),
                         "prompt_tokens_wordpiece": int(p)}) for i, (p, t, d) in enumerate(zip(prompt, tasks, decode))]
    (tmp_path / "f.jsonl").write_text("\n".join(lines) + "\n")
    c = read_corpus(tmp_path / "f.jsonl")
    scheme = SCHEMES["time4"]()
    train, test = c.split("train", 0.3), c.split("test", 0.3)
    f = ForestPredictor.fit(train, scheme, ForestSettings(n_estimators=20))
    acc = np.mean(f.predict_buckets(test.prompt_tokens, test.task_types) == scheme.bucket(test.decode_tokens))
    assert acc > 0.97
    length_only = ForestPredictor.fit(train, scheme, ForestSettings(n_estimators=20, use_task=False))
    acc_len = np.mean(length_only.predict_buckets(test.prompt_tokens, test.task_types) == scheme.bucket(test.decode_tokens))
    assert acc_len < acc - 0.1  # without the task the 80-vs-500 split is a coin flip
    f.save(tmp_path / "forest")
    again = make_predictor("forest", path=str(tmp_path / "forest"))
    b = _batch(test, with_text=False)  # a trace: no text needed
    assert np.array_equal(again.predict(b, np.random.default_rng(0)).bucket,
                          f.predict_buckets(test.prompt_tokens, test.task_types))
    # An application the forest never saw: decided by prompt length alone, no error.
    unseen = RequestBatch.from_arrays([0.0, 1.0], [10, 300], [5, 5], [0, 0], ("other",))
    assert again.predict(unseen, np.random.default_rng(0)).bucket[0] == 0
