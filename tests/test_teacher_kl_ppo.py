"""PPO with a KL penalty to a router teacher (agents/teacher_kl_ppo.py, issue 20 item 3)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env

import llm_lb_gym  # noqa: F401
from llm_lb_gym.agents import make_agent
from llm_lb_gym.agents.teacher_kl_ppo import TeacherAction, teacher_nll
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.rollout import make_env_router, router_choice

FEATS = ["arrivals_left", "age", "block_need", "free_kv_blocks", "waiting_blocks", "time_since_route"]
KW = dict(num_requests=40, arrival_rate_rps=60.0, reward={"mode": "baseline", "penalty": "latency",
                                                          "completion_reward": 0.0},
          action={"candidates": 3, "order": "shortest"}, obs={"features": FEATS})
LB = {"period_s": 0.1, "rounds": "since_release", "reserve": "full", "order": "shortest"}


def _wrapped():
    return TeacherAction(gym.make("LLMCluster-v0", **KW), "late_binding", LB)


def _venv():
    return make_vec_env(_wrapped, n_envs=1, seed=0)


def test_teacher_action_in_info_is_the_routers_choice_mapped_to_the_action_space():
    env = _wrapped()
    base = env.unwrapped
    ref = make_env_router("late_binding", base, **LB)
    obs, info = env.reset(seed=3)
    ref.reset(np.random.default_rng(0), base.m)
    seen = set()
    for _ in range(300):
        choice = router_choice(base, ref)
        a = base.defer_action if choice is None else base.action_for(*choice)
        expect = -1 if a is None or not base.action_masks()[a] else a
        assert info["teacher_action"] == expect
        seen.add(expect)
        # act otherwise than the teacher now and then, so the states are not only the teacher's
        mask = base.action_masks()
        act = expect if expect >= 0 and len(seen) % 2 else int(np.flatnonzero(mask)[0])
        obs, r, term, trunc, info = env.step(act)
        if term or trunc:
            break
    assert len(seen - {-1, base.defer_action}) >= 2   # it routed, not only held


def test_kl_term_is_zero_on_the_teachers_action_and_positive_otherwise():
    model = make_agent("maskable_ppo_kl", _venv(), n_steps=16, batch_size=16, seed=0)
    obs = th.as_tensor(model.env.reset(), dtype=th.float32)
    masks = th.as_tensor(np.stack(model.env.env_method("action_masks")))
    a_t = th.as_tensor([int(np.flatnonzero(masks[0].numpy())[0])])
    assert teacher_nll(model.policy, obs, masks, a_t).item() > 0
    assert teacher_nll(model.policy, obs, masks, th.as_tensor([-1])) is None
    # all mass on a_T: a huge logit on that action
    orig = model.policy.get_distribution

    def peaked(o, action_masks=None):
        d = orig(o, action_masks=action_masks)
        logits = th.full_like(d.distribution.logits, -1e9)
        logits[:, a_t[0]] = 0.0
        d.proba_distribution(logits)
        if action_masks is not None:
            d.apply_masking(action_masks)
        return d

    model.policy.get_distribution = peaked
    assert teacher_nll(model.policy, obs, masks, a_t).item() == pytest.approx(0.0, abs=1e-6)


def _params(model):
    return th.cat([p.detach().flatten() for p in model.policy.parameters()])


def test_coefficient_zero_is_semi_mdp_maskable_ppo():
    # each model built and trained in turn: torch's global RNG (seeded at construction) is shared
    common = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0, policy="equivariant", embed_dim=16,
                  net_arch=[16])

    def trained(name, **kw):
        venv = make_vec_env(_wrapped, n_envs=1, seed=0)
        model = make_agent(name, venv, **common, **kw)
        start = _params(model)
        model.learn(128)
        return start, _params(model), model

    start0, base, _ = trained("maskable_ppo")
    start1, kl0, _ = trained("maskable_ppo_kl", teacher_kl_coef=0.0, bc_epochs=0)
    assert th.equal(start0, start1)
    assert th.equal(base, kl0)
    _, kl, model = trained("maskable_ppo_kl", teacher_kl_coef=1.0, bc_epochs=1)
    assert not th.equal(base, kl)
    assert (model.rollout_buffer.teacher_actions >= 0).any()


def test_training_is_deterministic():
    def run():
        m = make_agent("maskable_ppo_kl", _venv(), n_steps=64, batch_size=32, n_epochs=1, seed=5,
                       teacher_kl_coef=1.0, teacher_kl_final=0.2, bc_epochs=2)
        m.learn(128)
        return _params(m)

    assert th.equal(run(), run())


def test_bad_options_and_unwrapped_envs_are_named_errors():
    with pytest.raises(ConfigError, match="teacher_kl_coef"):
        make_agent("maskable_ppo_kl", _venv(), teacher_kl_coef=-1.0)
    with pytest.raises(ConfigError, match="bc_epochs"):
        make_agent("maskable_ppo_kl", _venv(), bc_epochs=-2)
    plain = make_vec_env(lambda: gym.make("LLMCluster-v0", **KW), n_envs=1, seed=0)
    with pytest.raises(ConfigError, match="TeacherAction"):
        make_agent("maskable_ppo_kl", plain, n_steps=16, batch_size=16).learn(16)


def test_learned_router_ppo_trains_through_experiments_train_in_debug_size(tmp_path):
    import json

    from hydra import compose, initialize_config_dir

    from llm_lb_gym.experiments._hydra import CONF_DIR
    from llm_lb_gym.experiments.train import train

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            "experiment=[learned_router_ppo,debug]", "agent.kwargs.n_steps=64", "agent.kwargs.batch_size=32",
            "agent.kwargs.bc_epochs=2", "train.total_timesteps=128", "eval.episodes=1"])
    res = train(cfg, out=tmp_path)
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["imitation"] == {"teacher": "late_binding", "kl_penalty": True}
    assert {r["policy"] for r in res["eval"]["rows"]} >= {"round_robin", "learned_router_ppo"}
