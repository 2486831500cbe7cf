"""The learner's fast paths compute what the straightforward forms compute.

``DoubleDQN._update_loss`` joins replay and demonstration samples into three forward passes;
it must equal ``(1 - share) td(replay) + share td(demo) + w margin(demo)`` from the reference
``_td_loss`` / ``_margin_loss`` (seven passes), in value and gradient. The equivariant network's
pair head (broadcast sums, no loop over instances) must equal a pair-by-pair evaluation of its
definition. Acting (``predict`` with masks, a direct numpy -> tensor path) must pick what a
masked argmax over SB3's own ``obs_to_tensor`` picks, and the policy's training mode is only
toggled where it changes what the network computes.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.logger import Logger

from llm_lb_gym.agents.double_dqn import DoubleDQN
from llm_lb_gym.agents.equivariant import EquivariantDQNPolicy, InstanceSetQ
from llm_lb_gym.agents.replay import SemiMDPReplayBuffer

th.set_num_threads(1)
LAYOUT = dict(global_dim=2, num_candidates=3, candidate_dim=5, instance_dim=11)
M = 4
WIDTH = 2 + 3 * 5 + M * 11
N_ACTIONS = 3 * M + 1


class _SetEnv(gym.Env):
    """Only the spaces matter: observations of the equivariant layout with 4 instances."""

    observation_space = spaces.Box(-5.0, 5.0, shape=(WIDTH,), dtype=np.float32)
    action_space = spaces.Discrete(N_ACTIONS)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(WIDTH, np.float32), {}

    def step(self, action):
        return np.zeros(WIDTH, np.float32), 0.0, True, False, {}


def _buffer(n: int, seed: int) -> SemiMDPReplayBuffer:
    rng = np.random.default_rng(seed)
    env = _SetEnv()
    buf = SemiMDPReplayBuffer(n, env.observation_space, env.action_space, device="cpu",
                              handle_timeout_termination=False)
    for _ in range(n):
        mask = rng.random(N_ACTIONS) < 0.6
        mask[-1] = True
        buf.add(rng.normal(size=(1, WIDTH)).astype(np.float32), rng.normal(size=(1, WIDTH)).astype(np.float32),
                np.array([rng.integers(N_ACTIONS)]), np.array([rng.normal()]), np.array([rng.random() < 0.1]),
                [{"discount": float(rng.uniform(0.5, 1.0)), "action_mask": mask}])
    return buf


def _model(loss: str = "ce", **kwargs) -> DoubleDQN:
    model = DoubleDQN(EquivariantDQNPolicy, _SetEnv(), buffer_size=64, device="cpu", seed=0,
                      replay_buffer_class=SemiMDPReplayBuffer,
                      policy_kwargs=dict(layout=LAYOUT, embed_dim=16, net_arch=[32]), **kwargs)
    # Different online and target weights, so the Double-DQN argmax and the target's values differ.
    g = th.Generator().manual_seed(1)
    for p, pt in zip(model.q_net.parameters(), model.q_net_target.parameters()):
        with th.no_grad():
            p.copy_(th.randn(p.shape, generator=g) * 0.3)
            pt.copy_(th.randn(pt.shape, generator=g) * 0.3)
    model.replay_buffer = _buffer(64, seed=2)
    model.set_demonstrations(_buffer(32, seed=3), fraction=0.25, margin=0.5, weight=0.7, loss=loss)
    model.set_logger(Logger(folder=None, output_formats=[]))
    return model


def _grads(model, loss) -> list[th.Tensor]:
    model.policy.optimizer.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in model.q_net.parameters()]


@pytest.mark.parametrize("loss", ["ce", "margin"])
def test_joined_update_equals_the_three_separate_losses(loss):
    model = _model(loss)
    np.random.seed(0)
    replay, demo = model.replay_buffer.sample(24), model.demo_buffer.sample(8)
    share = 8 / 32
    reference = ((1 - share) * model._td_loss(replay) + share * model._td_loss(demo)
                 + 0.7 * model._margin_loss(demo))
    fast, margin = model._update_loss(replay, demo, 0.7)
    assert fast.item() == pytest.approx(reference.item(), rel=1e-5)
    assert margin.item() == pytest.approx(model._margin_loss(demo).item(), rel=1e-5)
    for a, b in zip(_grads(model, reference), _grads(model, fast)):
        assert th.allclose(a, b, rtol=1e-4, atol=1e-6)
    # Without demonstrations (or with their weight spent) it is the plain TD loss.
    alone, none = model._update_loss(replay)
    assert none is None and alone.item() == pytest.approx(model._td_loss(replay).item(), rel=1e-6)
    spent, none = model._update_loss(replay, demo, 0.0)
    td_only = (1 - share) * model._td_loss(replay) + share * model._td_loss(demo)
    assert none is None and spent.item() == pytest.approx(td_only.item(), rel=1e-5)


def test_joined_update_fills_a_plain_buffers_discount_and_mask():
    # SB3's own replay samples have no discount and no next mask: gamma and all-valid stand in.
    from stable_baselines3.common.buffers import ReplayBuffer

    model = _model()
    env = _SetEnv()
    plain = ReplayBuffer(16, env.observation_space, env.action_space, device="cpu")
    rng = np.random.default_rng(5)
    for _ in range(16):
        plain.add(rng.normal(size=(1, WIDTH)), rng.normal(size=(1, WIDTH)), np.array([1]),
                  np.array([0.5]), np.array([False]), [{}])
    replay, demo = plain.sample(12), model.demo_buffer.sample(4)
    fast, _ = model._update_loss(replay, demo, 0.0)
    reference = 0.75 * model._td_loss(replay) + 0.25 * model._td_loss(demo)
    assert fast.item() == pytest.approx(reference.item(), rel=1e-5)


def test_pair_head_equals_its_definition_pair_by_pair():
    # Q(j -> i) = V + A_ji - mean(A), A_ji = out(act(W_c c_j + b + W_e e_i + W_x ctx)), evaluated
    # here one pair at a time; the network does it with broadcast sums.
    net = InstanceSetQ(LAYOUT, embed_dim=8, hidden=(16,))
    x = th.randn(3, WIDTH, generator=th.Generator().manual_seed(4))
    with th.no_grad():
        ce, e, ctx = net.encode(x)
        assert th.equal(ctx[:, 8:16], e.max(dim=1).values)
        adv = th.empty(3, N_ACTIONS)
        for j in range(3):
            for i in range(M):
                h = net.pair_c(ce[:, j]) + net.pair_e(e[:, i]) + net.pair_ctx(ctx[:, :24])
                adv[:, j * M + i] = net.pair_out(net.pair_act(h))[:, 0]
        adv[:, -1] = net.defer(ctx)[:, 0]
        expected = net.value(ctx) + adv - adv.mean(dim=1, keepdim=True)
        assert th.allclose(net(x), expected, atol=1e-5)


def test_masked_predict_matches_sb3_obs_path_and_masked_argmax():
    model = _model()
    rng = np.random.default_rng(6)
    obs = rng.normal(size=(5, WIDTH))                      # float64: cast to float32 either way
    masks = rng.random((5, N_ACTIONS)) < 0.5
    masks[:, -1] = True
    sb3_obs, vectorized = model.policy.obs_to_tensor(obs)
    fast_obs, fast_vec = model._obs_tensor(obs)
    assert vectorized and fast_vec and th.equal(sb3_obs.float(), fast_obs)   # the net casts
    with th.no_grad():
        q = model.q_net(sb3_obs).masked_fill(~th.as_tensor(masks), -th.inf)
    actions, _ = model.predict(obs, deterministic=True, action_masks=masks)
    assert actions.tolist() == q.argmax(dim=1).tolist()
    one, _ = model.predict(obs[2].astype(np.float32), deterministic=True, action_masks=masks[2])
    assert np.ndim(one) == 0 and int(one) == actions[2]
    frozen = obs[2].astype(np.float32)
    frozen.flags.writeable = False                           # read-only arrays are copied, not shared
    assert int(model.predict(frozen, deterministic=True, action_masks=masks[2])[0]) == actions[2]
    with pytest.raises(ValueError):                          # a wrong width still gets SB3's error
        model.predict(obs[:, :-1], deterministic=True, action_masks=masks)


def test_training_mode_is_toggled_only_where_it_matters(monkeypatch):
    model = _model()
    calls = []

    def record(mode):
        calls.append(mode)
        model.policy.training = mode

    monkeypatch.setattr(model.policy, "set_training_mode", record)
    model.train(gradient_steps=2, batch_size=16)
    model.predict(np.zeros(WIDTH, np.float32), deterministic=True, action_masks=np.ones(N_ACTIONS, bool))
    assert calls == []                                       # no dropout or batch norm: nothing to switch
    model.policy.q_net.dropout = th.nn.Dropout(0.5)          # a policy whose mode matters
    del model.policy._mode_matters
    model.policy.training = True
    model.predict(np.zeros(WIDTH, np.float32), deterministic=True, action_masks=np.ones(N_ACTIONS, bool))
    model.train(gradient_steps=1, batch_size=16)
    model.train(gradient_steps=1, batch_size=16)
    assert calls == [False, True]                            # on each change, once


def test_default_adam_is_fused_and_a_chosen_variant_is_kept():
    assert _model().policy.optimizer.defaults["fused"] is True
    chosen = DoubleDQN(EquivariantDQNPolicy, _SetEnv(), buffer_size=8, device="cpu",
                       policy_kwargs=dict(layout=LAYOUT, embed_dim=8, net_arch=[8],
                                          optimizer_kwargs={"foreach": False}))
    assert not chosen.policy.optimizer.defaults["fused"]
    sgd = DoubleDQN("MlpPolicy", _SetEnv(), buffer_size=8, device="cpu",
                    policy_kwargs=dict(optimizer_class=th.optim.SGD))
    assert isinstance(sgd.policy.optimizer, th.optim.SGD)



def test_bench_learner_times_training_and_accounts_for_it():
    from llm_lb_gym.experiments.bench_learner import bench_learner

    r = bench_learner(steps=40, warmup=8)
    assert r["gradient_updates"] == 10 and r["batch_size"] == 256 and r["train_freq"] == 4
    assert r["train_env_steps_per_cpu_s"] > 0
    shares = [v for k, v in r.items() if k.startswith("cpu_share_")]
    assert len(shares) == 4 and all(v >= 0 for v in shares) and sum(shares) == pytest.approx(100.0)
    parts = sum(r[k] for k in ("ms_cpu_per_update_forward_passes_and_loss", "ms_cpu_per_update_backward_clip_adam",
                               "ms_cpu_per_update_sampling_and_rest"))
    assert parts == pytest.approx(r["ms_cpu_per_gradient_update"])
