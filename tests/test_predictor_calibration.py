"""Calibrated predictions (predictor/calibration.py) and held-out trace splits."""

from __future__ import annotations

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.predictor.buckets import BucketScheme
from llm_lb_gym.predictor.calibration import (CalibratedPredictor, CalibrationConfig,
                                              PredictiveTable)
from llm_lb_gym.predictor.noisy import NoisyOraclePredictor
from llm_lb_gym.predictor.registry import make_predictor
from llm_lb_gym.workload.batch import RequestBatch
from llm_lb_gym.workload.registry import make_workload
from llm_lb_gym.workload.trace_workload import TraceWorkload, split_rows

SCHEME = BucketScheme((256, 2048), name="paper_dqn")


def test_table_by_hand():
    """Two tasks, labels as given: each cell is the mean / quantile / bucket shares of its rows."""
    labels = np.array([0, 0, 0, 1, 1, 0, 0, 1])
    task = np.array([0, 0, 0, 0, 0, 1, 1, 1])
    d = np.array([10, 20, 300, 400, 3000, 50, 70, 500])
    t = PredictiveTable.fit(labels, task, d, SCHEME, 2, CalibrationConfig(min_cell=2, quantile=0.5))
    assert t.expected[0, 0] == pytest.approx(110.0)            # (10 + 20 + 300) / 3
    assert t.upper[0, 0] == pytest.approx(20.0)                 # median of 10, 20, 300
    assert t.probs[0, 0].tolist() == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert t.expected[0, 1] == pytest.approx(1700.0)
    assert t.probs[0, 1].tolist() == pytest.approx([0.0, 0.5, 0.5])
    assert t.expected[1, 0] == pytest.approx(60.0)
    # task 1 label 1 has one row (< min_cell 2): the label's pooled cell (rows 3, 4, 7)
    assert t.counts[1, 1] == 1
    assert t.expected[1, 1] == pytest.approx((400 + 3000 + 500) / 3)


def test_noisy_calibration_matches_bayes_on_the_task_mix():
    """E[d | label] of a calibrated noisy predictor equals the Bayes posterior mean computed
    independently from the prior: P(t | b) ~ P(b | t) P(t), P(b | t) = a or (1 - a)/(k - 1)."""
    a, k = 0.79, SCHEME.num_buckets
    mix = make_workload("task_mix")
    cal = CalibratedPredictor.on_workload(NoisyOraclePredictor(SCHEME, a), mix,
                                          CalibrationConfig(requests=200_000))
    ref = mix.sample(np.random.default_rng(1), 200_000)
    tb = SCHEME.bucket(ref.decode_tokens)
    for task in range(len(ref.task_names)):
        m = ref.task_id == task
        prior = np.bincount(tb[m], minlength=k) / m.sum()
        means = np.array([ref.decode_tokens[m][tb[m] == t].mean() if (tb[m] == t).any() else 0.0
                          for t in range(k)])
        for b in range(k):
            if cal.table.counts[task, b] < 2000:
                continue
            like = np.where(np.arange(k) == b, a, (1 - a) / (k - 1))
            post = like * prior / (like * prior).sum()
            assert cal.table.expected[task, b] == pytest.approx(float(post @ means), rel=0.05)
            assert cal.table.probs[task, b] == pytest.approx(post, abs=0.02)
    # the cliff of 0.6.0: a mislabelled ">= 2048" request is not 3,072 tokens long
    assert cal.table.expected[:, 2].max() < 1000 < SCHEME.representative_tokens[2]


def test_calibration_keeps_labels_and_draws():
    """Same labels, same generator state after predict: an episode changes only in its numbers."""
    mix = make_workload("task_mix")
    batch = mix.sample(np.random.default_rng(3), 500)
    base = NoisyOraclePredictor(SCHEME, 0.7)
    cal = CalibratedPredictor.on_workload(base, mix, CalibrationConfig(requests=5000))
    r1, r2 = np.random.default_rng(9), np.random.default_rng(9)
    p0, p1 = base.predict(batch, r1), cal.predict(batch, r2)
    assert np.array_equal(p0.bucket, p1.bucket)
    assert r1.random() == r2.random()
    assert (p1.upper_tokens >= p1.tokens).all() and p1.probs.shape == (500, 3)
    assert np.allclose(p1.probs.sum(axis=1), 1.0)


def test_env_reads_calibrated_tokens_and_upper_quantile():
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401
    env = gym.make("LLMCluster-v0", num_requests=300,
                   predictor={"name": "noisy", "accuracy": 0.8}).unwrapped
    env.reset(seed=0)
    tb = env.cluster.table
    assert len(set(tb.pred)) > 3                  # per (task, label), not 3 bucket midpoints
    assert all(h >= p for h, p in zip(tb.pred_hi, tb.pred))
    assert any(h > p for h, p in zip(tb.pred_hi, tb.pred))
    off = gym.make("LLMCluster-v0", num_requests=300,
                   predictor={"name": "noisy", "accuracy": 0.8, "calibration": False}).unwrapped
    off.reset(seed=0)
    assert set(off.cluster.table.pred) <= set(SCHEME.representative_tokens)
    env2 = gym.make("LLMCluster-v0", num_requests=300,
                    predictor={"name": "noisy", "accuracy": 0.8}).unwrapped
    env2.reset(seed=0)
    assert env2.cluster.table.pred == tb.pred and env2.cluster.table.pred_hi == tb.pred_hi


def test_calibration_option_errors():
    with pytest.raises(ConfigError, match="oracle.*calibration must be false"):
        make_predictor("oracle", calibration=True)
    with pytest.raises(ConfigError, match="calibration has unknown option.*quantil; allowed: requests"):
        make_predictor("noisy", accuracy=0.8, calibration={"quantil": 0.9})
    with pytest.raises(ConfigError, match="predictor.calibration.quantile"):
        make_predictor("noisy", accuracy=0.8, calibration={"quantile": 1.0})
    with pytest.raises(ConfigError, match="must be true, false or a dict"):
        make_predictor("noisy", accuracy=0.8, calibration="yes")


def test_a_batch_of_its_own_matches_tasks_by_name_and_pools_unknown_ones():
    mix = make_workload("task_mix")
    cal = make_predictor("noisy", workload=mix, accuracy=0.8)
    names = cal.task_names
    other = RequestBatch.from_arrays([0.0, 0.1], [10, 10], [10, 10], [0, 1], ("chat", names[2]))
    p = cal.predict(other, np.random.default_rng(0))
    exp_pooled = cal.table.pooled[0]
    assert p.tokens[0] == exp_pooled[p.bucket[0]]                 # 'chat': unknown, pooled cell
    assert p.tokens[1] == cal.table.expected[2, p.bucket[1]]      # matched by name


def test_split_rows_fixed_disjoint_and_covering():
    for timestamped in (True, False):
        tr = split_rows(1000, timestamped, "train", 0.3)
        te = split_rows(1000, timestamped, "test", 0.3)
        assert not (tr & te).any() and (tr | te).all() and te.sum() == 300
        assert np.array_equal(te, split_rows(1000, timestamped, "test", 0.3))
    te = split_rows(1000, True, "test", 0.3)
    assert te[700:].all() and not te[:700].any()        # the future is held out


def test_trace_split_episodes_and_calibration(tmp_path):
    rows = "".join(f"{i * 0.5},m,{10 + i},{5 + i % 7}\n" for i in range(200))
    f = tmp_path / "t.csv"
    f.write_text("Timestamp,Model,Request tokens,Response tokens\n" + rows)
    fmt = "burstgpt"
    test = TraceWorkload(path=str(f), format=fmt, split="test", test_fraction=0.25)
    train = TraceWorkload(path=str(f), format=fmt, split="train", test_fraction=0.25)
    assert len(test._rows.prompt_tokens) == 50 and len(train._rows.prompt_tokens) == 150
    assert set(test._rows.prompt_tokens).isdisjoint(train._rows.prompt_tokens)
    hist = test.calibration_sample(np.random.default_rng(0), 40)
    assert set(hist.prompt_tokens.tolist()) <= set(train._rows.prompt_tokens.tolist())
    with pytest.raises(ConfigError, match="split"):
        TraceWorkload(path=str(f), format=fmt, split="held")
    with pytest.raises(ConfigError, match="test_fraction"):
        TraceWorkload(path=str(f), format=fmt, split="test", test_fraction=1.0)


def test_observation_feature_pred_upper_is_the_heads_quantile():
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401
    env = gym.make("LLMCluster-v0", num_requests=200, obs={"features": ["pred_upper"], "normalize": False})
    obs, info = env.reset(seed=2)
    u = env.unwrapped
    assert u.obs_layout.candidate_dim == 4
    for _ in range(40):
        obs, *_rest, info = env.step(u.m)   # defer: the head stays, the clock moves
        q = u.cluster.queue
        if q:
            assert obs[1 + 3] == np.float32(u.cluster.table.pred_hi[q[0]])
            assert obs[1 + 2] == np.float32(u.cluster.table.pred[q[0]])
            break
    else:
        pytest.fail("no queued head to look at")
