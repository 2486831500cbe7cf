"""DoubleDQN: the target with hand-set networks, one exact gradient step, masking, a smoke run.

The networks have no hidden layer (``net_arch=[]``), so Q(s) = W s + b and every number below
is worked by hand. On s' = (1, 0) the online net prefers action 1 while the target net prefers
action 0, the case where Double DQN and SB3's max-target disagree.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import DQN
from stable_baselines3.common.logger import Logger

from llm_lb_gym.agents.double_dqn import DoubleDQN
from llm_lb_gym.agents.paper_defaults import PaperDQNDefaults, paper_kwargs
from llm_lb_gym._validate import ConfigError

th.set_num_threads(1)

S = np.array([0.0, 1.0], dtype=np.float32)
S_NEXT = np.array([1.0, 0.0], dtype=np.float32)
ACTION = 1
REWARD = 1.0
GAMMA = 0.5
LR = 0.1
Q_ONLINE_NEXT = [1.0, 5.0, 2.0]  # argmax 1
Q_TARGET_NEXT = [10.0, 3.0, 7.0]  # argmax 0; value of the online choice: 3
Q_ONLINE_S_A = 2.0
DOUBLE_TARGET = REWARD + GAMMA * 3.0  # 2.5
PLAIN_TARGET = REWARD + GAMMA * 10.0  # 6.0


class TinyEnv(gym.Env):
    """Two-dimensional observations, three actions; only its spaces matter here."""

    observation_space = spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float32)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return S.copy(), {}

    def step(self, action):
        return S_NEXT.copy(), REWARD, True, False, {}


def _set_linear(net: th.nn.Module, weight: list[list[float]]) -> None:
    (layer,) = [m for m in net.modules() if isinstance(m, th.nn.Linear)]
    with th.no_grad():
        layer.weight.copy_(th.tensor(weight))
        layer.bias.zero_()


def _model(cls: type, done: bool = False) -> DQN:
    """A model with hand-set networks, SGD, and one known transition in its replay buffer."""
    model = cls(
        "MlpPolicy", TinyEnv(), gamma=GAMMA, learning_rate=LR, buffer_size=16, device="cpu",
        policy_kwargs=dict(net_arch=[], optimizer_class=th.optim.SGD), max_grad_norm=1e6, seed=0,
    )
    # Column 0 gives Q(s'), column 1 gives Q(s); only action 1 has a nonzero Q(s).
    _set_linear(model.q_net, [[Q_ONLINE_NEXT[0], 0.0], [Q_ONLINE_NEXT[1], Q_ONLINE_S_A], [Q_ONLINE_NEXT[2], 0.0]])
    _set_linear(model.q_net_target, [[v, 0.0] for v in Q_TARGET_NEXT])
    model.replay_buffer.add(
        S[None], S_NEXT[None], np.array([ACTION]), np.array([REWARD]), np.array([done]), [{}]
    )
    model.set_logger(Logger(folder=None, output_formats=[]))
    return model


def test_networks_disagree_on_next_state():
    model = _model(DoubleDQN)
    obs = th.as_tensor(S_NEXT[None])
    assert model.q_net(obs)[0].tolist() == Q_ONLINE_NEXT
    assert model.q_net_target(obs)[0].tolist() == Q_TARGET_NEXT


@pytest.mark.parametrize("done, expected", [(False, DOUBLE_TARGET), (True, REWARD)])
def test_target_is_target_net_value_of_online_argmax(done, expected):
    model = _model(DoubleDQN, done=done)
    batch = model.replay_buffer.sample(4)
    target = model._target_q(batch.next_observations, batch.rewards, batch.dones)
    assert target.shape == (4, 1)
    assert target.flatten().tolist() == [expected] * 4
    # The same transition under SB3's rule: r + gamma (1 - done) max_a Q_target(s', a).
    plain = batch.rewards + (1 - batch.dones) * GAMMA * model.q_net_target(batch.next_observations).max(1, keepdim=True)[0]
    if done:
        assert th.equal(target, plain)
    else:
        assert plain.flatten().tolist() == [PLAIN_TARGET] * 4
        assert not th.equal(target, plain)


def test_target_equals_plain_max_when_the_networks_agree():
    model = _model(DoubleDQN)
    _set_linear(model.q_net_target, [[1.0, 0.0], [9.0, 0.0], [2.0, 0.0]])  # argmax 1 like online
    batch = model.replay_buffer.sample(2)
    target = model._target_q(batch.next_observations, batch.rewards, batch.dones)
    assert target.flatten().tolist() == [REWARD + GAMMA * 9.0] * 2


def test_target_uses_per_sample_nstep_discounts():
    model = _model(DoubleDQN)
    batch = model.replay_buffer.sample(2)
    discounts = th.tensor([[0.25], [1.0]])
    target = model._target_q(batch.next_observations, batch.rewards, batch.dones, discounts)
    assert target.flatten().tolist() == [REWARD + 0.25 * 3.0, REWARD + 3.0]


def _q_s_a(model: DQN) -> float:
    with th.no_grad():
        return float(model.q_net(th.as_tensor(S[None]))[0, ACTION])


def test_one_train_step_moves_online_net_towards_double_target():
    # Huber loss: dL/dQ = Q - y when |Q - y| <= 1, else sign(Q - y). With SGD the step on the
    # taken action's row is  w -= lr * dL/dQ * s,  b -= lr * dL/dQ  (a batch of identical samples
    # averages to the same gradient).
    double = _model(DoubleDQN)
    double.train(gradient_steps=1, batch_size=8)
    g_double = Q_ONLINE_S_A - DOUBLE_TARGET  # -0.5, inside the quadratic zone
    expected_double = Q_ONLINE_S_A - LR * g_double * (1.0 + 1.0)  # weight and bias both move
    assert _q_s_a(double) == pytest.approx(expected_double, abs=1e-6)
    assert abs(_q_s_a(double) - DOUBLE_TARGET) < abs(Q_ONLINE_S_A - DOUBLE_TARGET)
    assert double._n_updates == 1

    plain = _model(DQN)
    plain.train(gradient_steps=1, batch_size=8)
    g_plain = -1.0  # Q - y = -4 is clipped by the Huber loss
    assert _q_s_a(plain) == pytest.approx(Q_ONLINE_S_A - LR * g_plain * 2.0, abs=1e-6)
    assert _q_s_a(double) != pytest.approx(_q_s_a(plain), abs=1e-3)

    # Only the taken action's row moves; the target network is untouched by train().
    q_next = double.q_net(th.as_tensor(S_NEXT[None]))[0].tolist()
    assert q_next[0] == Q_ONLINE_NEXT[0] and q_next[2] == Q_ONLINE_NEXT[2]
    assert double.q_net_target(th.as_tensor(S_NEXT[None]))[0].tolist() == Q_TARGET_NEXT


def test_train_logs_loss():
    model = _model(DoubleDQN)
    model.train(gradient_steps=2, batch_size=4)
    assert model.logger.name_to_value["train/loss"] == pytest.approx(0.5 * 0.5**2, rel=0.2)


def test_masked_predict_picks_best_valid_action():
    model = _model(DoubleDQN)
    assert int(model.predict(S_NEXT, deterministic=True)[0]) == 1
    action, _ = model.predict(S_NEXT, deterministic=True, action_masks=np.array([True, False, True]))
    assert action.shape == () and int(action) == 2
    batch = np.stack([S_NEXT, S_NEXT])
    masks = np.array([[True, False, False], [False, True, True]])
    assert model.predict(batch, deterministic=True, action_masks=masks)[0].tolist() == [0, 1]


def test_masked_exploration_samples_only_valid_actions():
    model = _model(DoubleDQN)
    model.exploration_rate = 1.0
    np.random.seed(0)
    picks = {int(model.predict(S_NEXT, action_masks=[False, True, True])[0]) for _ in range(50)}
    assert picks == {1, 2}


@pytest.mark.parametrize("masks", [[True, False], [False, False, False]])
def test_bad_masks_are_rejected(masks):
    with pytest.raises(ConfigError, match="action_masks"):
        _model(DoubleDQN).predict(S_NEXT, action_masks=masks)


def test_paper_exploration_ends_at_episode_20():
    defaults = PaperDQNDefaults()
    kwargs = paper_kwargs(total_timesteps=10_000, episode_steps=100)
    assert kwargs["exploration_fraction"] == 0.2 and kwargs["batch_size"] == 512
    assert kwargs["policy_kwargs"]["net_arch"] == [64, 64]
    assert kwargs["policy_kwargs"]["activation_fn"] is th.nn.ReLU
    assert defaults.exploration_fraction(1_000, 100) == 1.0  # capped: fewer than 20 episodes
    model = DoubleDQN("MlpPolicy", TinyEnv(), device="cpu", **kwargs)
    progress_remaining = lambda step: 1.0 - step / 10_000  # noqa: E731 (SB3's convention)
    assert model.exploration_schedule(progress_remaining(1_999)) > 0.0
    assert model.exploration_schedule(progress_remaining(2_000)) == pytest.approx(0.0, abs=1e-12)
    assert model.exploration_schedule(progress_remaining(2_001)) == 0.0


def test_paper_kwargs_overrides():
    kwargs = paper_kwargs(exploration_end_episode=5, batch_size=64, gamma=0.9,
                          total_timesteps=1000, episode_steps=10, policy_kwargs={"activation_fn": "tanh"})
    assert kwargs["exploration_fraction"] == 0.05 and kwargs["batch_size"] == 64 and kwargs["gamma"] == 0.9
    assert kwargs["policy_kwargs"] == {"net_arch": [64, 64], "activation_fn": th.nn.Tanh}
    assert "exploration_fraction" not in paper_kwargs()
    with pytest.raises(ConfigError, match="batch_size"):
        paper_kwargs(batch_size=0)


@pytest.mark.parametrize("n_steps", [1, 3])
def test_cartpole_smoke(n_steps):
    model = DoubleDQN("MlpPolicy", "CartPole-v1", learning_starts=50, batch_size=32, train_freq=1,
                      target_update_interval=50, n_steps=n_steps, seed=0, device="cpu")
    model.learn(200)
    assert model.num_timesteps == 200
    assert model._n_updates == 150
    assert np.isfinite(model.logger.name_to_value.get("train/loss", 0.0))
