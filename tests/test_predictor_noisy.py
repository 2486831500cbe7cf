"""Oracle, noisy oracle, confusion-matrix predictor and the predictor registry."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.predictor.base import LengthPredictor
from llm_lb_gym.predictor.buckets import SCHEMES
from llm_lb_gym.predictor.registry import PREDICTORS, make_predictor
from llm_lb_gym.workload.batch import RequestBatch


def _batch(n=20000, seed=0):
    rng = np.random.default_rng(seed)
    decode = rng.integers(1, 600, size=n)
    return RequestBatch.from_arrays(np.arange(n) * 0.05, rng.integers(1, 500, size=n), decode)


def test_oracle_is_exact():
    b = _batch(500)
    p = make_predictor("oracle", scheme="time4").predict(b, np.random.default_rng(0))
    assert np.array_equal(p.bucket, SCHEMES["time4"]().bucket(b.decode_tokens))
    assert np.array_equal(p.tokens, b.decode_tokens.astype(float))
    assert p.scheme == SCHEMES["time4"]()
    assert isinstance(make_predictor("oracle"), LengthPredictor)
    assert make_predictor("oracle").scheme == SCHEMES["paper_dqn"]()


@pytest.mark.parametrize("acc", [0.05, 0.3, 0.8, 1.0])
def test_noisy_oracle_hits_its_accuracy_with_uniform_errors(acc):
    b = _batch()
    scheme = SCHEMES["time4"]()
    true = scheme.bucket(b.decode_tokens)
    p = make_predictor("noisy", accuracy=acc, scheme="time4").predict(b, np.random.default_rng(1))
    hit = np.mean(p.bucket == true)
    assert abs(hit - acc) < 0.015
    wrong = p.bucket[p.bucket != true] - true[p.bucket != true]
    if acc < 1:
        # errors spread evenly over the 3 other buckets
        shares = np.bincount((wrong % 4), minlength=4)[1:] / len(wrong)
        assert np.all(np.abs(shares - 1 / 3) < 0.03)
    assert np.array_equal(p.tokens, scheme.representative(p.bucket))


def test_noisy_is_seeded():
    b = _batch(1000)
    pred = make_predictor("noisy", accuracy=0.5)
    a = pred.predict(b, np.random.default_rng(7)).bucket
    assert np.array_equal(a, pred.predict(b, np.random.default_rng(7)).bucket)
    assert not np.array_equal(a, pred.predict(b, np.random.default_rng(8)).bucket)


def test_confusion_predictor_reproduces_row_frequencies():
    m = [[80, 20, 0], [10, 60, 30], [0, 0, 0]]  # the last bucket was never observed
    b = _batch()
    scheme = SCHEMES["paper_dqn"]()
    decode = b.decode_tokens.copy()
    decode[-50:] = 3000
    b2 = RequestBatch.from_arrays(b.arrival_s, b.prompt_tokens, decode)
    true = scheme.bucket(b2.decode_tokens)
    p = make_predictor("confusion", matrix=m, scheme="paper_dqn").predict(b2, np.random.default_rng(3))
    for i, row in enumerate(m[:2]):
        got = np.bincount(p.bucket[true == i], minlength=3) / np.sum(true == i)
        assert np.allclose(got, np.array(row) / sum(row), atol=0.02)
    assert np.all(p.bucket[true == 2] == 2)  # unobserved row: predicted correctly


def test_confusion_identity_equals_oracle_buckets():
    b = _batch(2000)
    p = make_predictor("confusion", matrix=np.eye(3) * 5).predict(b, np.random.default_rng(0))
    assert np.array_equal(p.bucket, SCHEMES["paper_dqn"]().bucket(b.decode_tokens))


def test_confusion_from_metrics_file(tmp_path):
    data = {"scheme": {"name": "time0.5-2.0-4.0s@60tps", "edges_tokens": [30, 120, 240]},
            "bucket_mean_tokens": [10.0, 70.0, 170.0, 480.0],
            "model": {"confusion": [[9, 1, 0, 0], [1, 8, 1, 0], [0, 2, 6, 2], [0, 0, 1, 9]]},
            "baselines": {"per_task_majority": {"confusion": np.eye(4).tolist()}}}
    f = tmp_path / "metrics.json"
    f.write_text(json.dumps(data))
    p = make_predictor("confusion", path=str(f))
    assert p.scheme == SCHEMES["time4"]()
    out = p.predict(_batch(3000), np.random.default_rng(0))
    assert set(np.unique(out.tokens)) <= {10.0, 70.0, 170.0, 480.0}
    assert make_predictor("confusion", path=str(tmp_path), which="per_task_majority").probs.tolist() == np.eye(4).tolist()
    with pytest.raises(ConfigError, match="which='nope' is not valid.*allowed: model, per_task_majority"):
        make_predictor("confusion", path=str(f), which="nope")


def test_registry_errors_list_names_and_options():
    with pytest.raises(ConfigError, match="unknown predictor 'bert'; allowed: confusion, forest, light, "
                                          "noisy, oracle, transformer"):
        make_predictor("bert")
    assert set(PREDICTORS) >= {"oracle", "noisy", "confusion", "transformer", "light", "forest"}
    with pytest.raises(ConfigError, match="unknown predictor 'noisy' option.*acc; allowed: accuracy, calibration, scheme"):
        make_predictor("noisy", acc=0.5)
    with pytest.raises(ConfigError, match="needs accuracy"):
        make_predictor("noisy")
    with pytest.raises(ConfigError, match=r"noisy.accuracy=1.5 is out of range; allowed: .*\(0.0, 1.0\]"):
        make_predictor("noisy", accuracy=1.5)
    with pytest.raises(ConfigError, match=r"noisy.accuracy=0.0 is out of range; allowed: .*\(0.0, 1.0\]"):
        make_predictor("noisy", accuracy=0.0)   # a predictor that is never right is not a predictor
    with pytest.raises(ConfigError, match="unknown bucket scheme 'x'"):
        make_predictor("oracle", scheme="x")
    with pytest.raises(ConfigError, match="exactly one of path"):
        make_predictor("confusion")
    with pytest.raises(ConfigError, match=r"shape \(2, 2\); scheme 'paper_dqn' needs \(3, 3\)"):
        make_predictor("confusion", matrix=[[1, 0], [0, 1]])
    with pytest.raises(ConfigError, match="unknown predictor 'transformer' option.*allowed: inference_max_length, micro_batch, path"):
        make_predictor("transformer", path="x", max_len=3)
    with pytest.raises(ConfigError, match="not a saved predictor directory"):
        make_predictor("forest", path="/nonexistent/model")
