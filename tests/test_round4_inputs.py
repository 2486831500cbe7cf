"""Issue 31's inputs (reliability, fourth round): each is a named error before any work, or a
correct result with every request accounted for.

Classes 2-5 of the issue: checks that came after the work (reproduce, improve, policy_search),
raw exceptions (config.json, task-mix weights, env methods before reset, RequestBatch from
lists), silent acceptance (fractional tokens, teacher options, two GPUs of one name, more
requests than steps) and labels that did not match the run (model_config, env.<group>).
Hypothesis: random config.json dicts, and option trees with a group misplaced under ``env``.
"""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llm_lb_gym  # noqa: F401
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.experiments._hydra import compose, env_kwargs
from llm_lb_gym.sim.architecture import ModelArchitecture, from_hf_config
from llm_lb_gym.workload.batch import RequestBatch

GPU = {"name": "x1", "memory_bytes": 25.2e9, "memory_bandwidth_bytes_s": 933e9, "fp16_flops": 165e12,
       "interconnect_bytes_s": 32e9, "interconnect": "pcie"}


def _nothing_written(path) -> bool:
    return not path.exists() or not any(path.iterdir())


# --------------------------------------------------------------------------- class 2: checks first
@pytest.mark.parametrize("overrides, match", [
    (["settings=[]"], r"settings=\[\] lists no setting: nothing to reproduce"),
    (["settings=[paper_v100,nope]"], r"settings: 'nope' is not an experiment; allowed: debug, "),
    (["run_variants=[baseline_rl,nope]"], r"run_variants: 'nope' is not a variant; allowed: baseline_rl"),
    (["run_variants=[wg_rl]", "+variants.wg_rl.typo=1"], r"unknown variants.wg_rl option\(s\): typo"),
    (["run_variants=[wg_rl]", "transfer=[{setting: v100_near_capacity, variant: wg_rl, num_instances: 8, "
      "policies: [round_robin]}]"], r"transfer\[0\].setting='v100_near_capacity' is not valid; allowed: paper_v100"),
    (["run_variants=[wg_rl]", "transfer=[{setting: paper_v100, variant: wa_rl, num_instances: 8, "
      "policies: [round_robin]}]"], r"transfer\[0\].variant='wa_rl' is not valid; allowed: wg_rl"),
    (["run_variants=[wg_rl]", "transfer=[{setting: paper_v100, variant: wg_rl, num_instances: 0, "
      "policies: [round_robin]}]"], r"transfer\[0\].num_instances=0 is out of range"),
    (["run_variants=[wg_rl]", "variants.wg_rl.reward=nope"], r"run_variants: 'wg_rl'.*Could not find 'reward/nope'"),
    (["run_variants=[wg_rl]", "policies=[round_robin,nope]"], r"unknown router 'nope'"),
    (["run_variants=[wg_rl]", "eval_episodes=0"], r"eval_episodes=0 is out of range"),
    (["run_variants=[wg_rl]", "models_from=/nonexistent/run"], r"models_from='/nonexistent/run' is not a directory"),
])
def test_reproduce_checks_every_option_before_training(tmp_path, overrides, match):
    from llm_lb_gym.experiments.reproduce import reproduce

    cfg = compose("reproduce", ["extra_experiments=[debug]", "extra_policies=[]", "figures=false", *overrides])
    with pytest.raises(ConfigError, match=match):
        reproduce(cfg, out=tmp_path / "run")
    assert _nothing_written(tmp_path / "run")


def test_improve_checks_its_teacher_and_its_test_before_training(tmp_path):
    from llm_lb_gym.experiments.improve import improve

    base = ["experiment=[v100_near_capacity,learned_router,debug]"]
    for overrides, match in [
        (["improve.teacher=nope"], r"improve.teacher='nope' is not valid; allowed: round_robin"),
        (["improve.teacher=late_binding", "improve.teacher_options={period_s: -1.0}"],
         r"improve.teacher_options: router.late_binding.period_s=-1.0 is out of range"),
        (["improve.teacher=late_binding", "improve.teacher_options={periods: 1.0}"],
         r"improve.teacher_options: unknown router 'late_binding' option\(s\): periods"),
        (["test.policies=[round_robin,jsq]", "improve.teacher=late_binding",
          "improve.teacher_options={}"], r"test.policies=\['round_robin', 'jsq'\] lacks the teacher 'late_binding'"),
        (["test.episodes=0"], r"test.episodes=0 is out of range"),
    ]:
        with pytest.raises(ConfigError, match=match):
            improve(compose("improve", base + overrides), out=tmp_path / "run")
        assert _nothing_written(tmp_path / "run")


def test_policy_search_checks_the_objective_and_the_test_before_searching(tmp_path):
    from llm_lb_gym.experiments.policy_search import search

    base = ["experiment=debug", "search.generations=1", "search.population=2", "search.workers=1"]
    with pytest.raises(ConfigError, match=r"search.objective=slo needs SLO deadlines, and env.slo=None"):
        search(compose("policy_search", base + ["search.objective=slo", "env.slo=null"]), out=tmp_path / "a")
    with pytest.raises(ConfigError, match=r"search.start \(scored_binding's options \{'period_s': -1\}\): "
                                          r"router.scored_binding.period_s=-1 is out of range"):
        search(compose("policy_search", base + ["+eval.policy_options.late_binding.period_s=-1"]),
               out=tmp_path / "b")
    with pytest.raises(ConfigError, match=r"unknown test.policy_options.jsq option\(s\): x; allowed: $"):
        search(compose("policy_search", base + ["+eval.policy_options.jsq.x=1"]), out=tmp_path / "b")
    assert _nothing_written(tmp_path / "a") and _nothing_written(tmp_path / "b")


def test_evaluate_checks_every_policys_option_values_before_the_first_episode(tmp_path):
    from llm_lb_gym.experiments._evaluation import evaluate

    cfg = compose("evaluate", ["experiment=debug", "policies=[round_robin,late_binding]",
                               "policy_options={late_binding: {period_s: -1.0}}", "plot=false"])
    with pytest.raises(ConfigError, match=r"^policy_options.late_binding: router.late_binding.period_s=-1.0"):
        evaluate(cfg, out=tmp_path / "run")
    assert _nothing_written(tmp_path / "run")


def test_train_checks_the_imitation_teachers_options():
    from llm_lb_gym.experiments._training import _check_train_cfg

    cfg = compose("train", ["experiment=[learned_router,debug]",
                            "++train.imitation.teacher_options.reserve=half"])
    with pytest.raises(ConfigError, match=r"train.imitation.teacher_options: router.late_binding.reserve='half'"):
        _check_train_cfg(cfg)


# --------------------------------------------------------------------------- class 3: named errors
_CONFIG_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                "vocab_size", "max_position_embeddings", "num_key_value_heads", "head_dim",
                "torch_dtype", "tie_word_embeddings", "attention_bias", "hidden_act", "model_type")
_VALUES = st.one_of(st.integers(-2, 5000), st.sampled_from([0, 1, 64, 4096, 2**40]), st.none(),
                    st.booleans(), st.floats(allow_nan=True), st.text(max_size=4),
                    st.sampled_from(["float16", "bfloat16", "float32", "int8", "silu", "llama"]),
                    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=st.dictionaries(st.sampled_from(_CONFIG_KEYS), _VALUES, max_size=len(_CONFIG_KEYS)),
       complete=st.booleans())
def test_random_config_json_builds_or_names_its_key(tmp_path_factory, cfg, complete):
    if complete:   # start from a valid config, then overwrite some keys
        cfg = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
               "vocab_size": 100, "max_position_embeddings": 512, **cfg}
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(json.dumps(cfg))
    try:
        arch = from_hf_config(path)
    except ConfigError as err:
        assert str(err).startswith(f"model config {path}: ")
        return
    assert isinstance(arch, ModelArchitecture) and arch.weight_bytes > 0 and arch.kv_bytes_per_token > 0


@pytest.mark.parametrize("bad, key", [({"num_attention_heads": 0}, "num_attention_heads=0"),
                                      ({"hidden_size": "4096"}, "hidden_size='4096'"),
                                      ({"hidden_size": None}, "hidden_size=None"),
                                      ({"num_key_value_heads": 0}, "num_key_value_heads=0"),
                                      ({"tie_word_embeddings": "false"}, "tie_word_embeddings='false'")])
def test_config_json_errors_name_the_file_and_key(tmp_path, bad, key):
    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
           "vocab_size": 100, "max_position_embeddings": 512, **bad}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=f"^model config {tmp_path / 'config.json'}: {key}"):
        gym.make("LLMCluster-v0", engine={"model_config": str(tmp_path), "gpu": "a100-80gb"})


@pytest.mark.parametrize("weights", [["1", 1, 1, 1, 1], ["x", 1, 1, 1, 1], [None] * 5,
                                     {"qna": "2"}, 5])
def test_task_mix_weights_that_are_not_numbers_are_named(weights):
    with pytest.raises(ConfigError, match=r"weights(\[qna\]|\[translation\])?=.*(not a number|is not valid)"):
        gym.make("LLMCluster-v0", workload={"name": "task_mix", "weights": weights})


def test_env_methods_before_reset_say_so():
    env = gym.make("LLMCluster-v0", num_requests=5).unwrapped
    for call, name in ((env.metrics, "metrics()"), (lambda: env.action_for(0, 0), "action_for()")):
        with pytest.raises(RuntimeError, match=rf"^{name.replace('(', '[(]').replace(')', '[)]')} before reset\(\)"):
            call()


def test_request_batch_from_lists_and_whole_floats_equals_from_arrays():
    a = RequestBatch([0.0, 1.5], [10, 20], [5.0, 6.0], [0, 0])
    b = RequestBatch.from_arrays([0.0, 1.5], [10, 20], [5, 6])
    for col in ("arrival_s", "prompt_tokens", "decode_tokens", "task_id"):
        assert getattr(a, col).dtype == getattr(b, col).dtype
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col))


def test_fractional_tokens_are_rejected_at_the_batch_not_run():
    with pytest.raises(ValueError, match=r"RequestBatch.decode_tokens must be whole numbers"):
        RequestBatch(np.array([0.0, 1.0]), np.array([10, 20]), np.array([5.5, 6.0]), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"RequestBatch.prompt_tokens must be integers"):
        RequestBatch([0.0], ["10"], [5], [0])


# --------------------------------------------------------------------------- class 4: no silent acceptance
@pytest.mark.parametrize("mode", ["baseline", "workload_guided"])
def test_out_of_range_teacher_options_fail_at_make_in_every_mode(mode):
    with pytest.raises(ConfigError, match=r"reward.teacher_options: router.late_binding.period_s=-1"):
        gym.make("LLMCluster-v0", reward={"mode": mode, "teacher": "late_binding",
                                          "teacher_options": {"period_s": -1.0}})


def test_two_declared_gpus_of_one_name_and_other_figures_are_refused():
    one = {"count": 1, "model_config": "llama2-7b", "gpu": GPU}
    other = {"count": 1, "model_config": "llama2-7b", "gpu": {**GPU, "fp16_flops": 100e12}}
    with pytest.raises(ConfigError, match=r"instances 0 and 1 declare GPU 'x1' with different figures"):
        gym.make("LLMCluster-v0", instances=[one, other])
    env = gym.make("LLMCluster-v0", instances=[one, dict(one)])    # the same GPU twice is fine
    assert env.unwrapped.cluster_cfg.describe() == "2 x llama2-7b/x1/tp1"


# --------------------------------------------------------------------------- class 5: labels
def test_the_cluster_label_is_the_hardware_that_runs(tmp_path):
    from llm_lb_gym.experiments._evaluation import evaluate

    cfg = compose("evaluate", ["experiment=debug", "policies=[round_robin]", "episodes=1", "plot=false",
                               "+engine.model_config=llama2-7b", "+engine.gpu=a100-80gb", "progress=false"])
    evaluate(cfg, out=tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert "x llama2-7b/a100-80gb/tp1" in text and "llama2-7b-v100" not in text


_MISPLACED = st.sampled_from([
    ("engine", "num_kv_blocks", 500, lambda env: env.cluster_cfg.engines[0].total_blocks == 500),
    ("workload", "name", "task_mix", None),
    ("reward", "mode", "baseline", lambda env: env.cfg.reward.mode == "baseline"),
    ("predictor", "name", "oracle", None),
])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(item=_MISPLACED, under_env=st.booleans(), group_null=st.booleans())
def test_an_option_under_env_is_applied_or_named_never_dropped(item, under_env, group_null):
    group, key, value, took = item
    over = [f"+env.{group}.{key}={value}" if under_env else f"{group}.{key}={value}"]
    if group_null:
        over.append(f"{group}=null" if group != "engine" else "engine=v100")
    try:
        cfg = compose("evaluate", ["experiment=debug", *over])
    except Exception:   # Hydra refuses the override itself (a named error of its own)
        return
    try:
        kw = env_kwargs(cfg)
    except ConfigError as err:
        assert under_env and f"env.{group} is set" in str(err) and f"write {group}.{key}" in str(err)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            env = gym.make("LLMCluster-v0", **kw).unwrapped
        except ConfigError:   # the value itself is refused in this setting (a named error)
            return
    if took is not None:
        assert took(env)
