"""Agents package: callbacks to TensorBoard, REINFORCE and heuristic agents, the factory.

``FakeClusterEnv`` stands in for ``LLMCluster-v0``: it emits the same info keys
(``reward_components``, ``guidance_weight``, ``action_mask``, final-step ``metrics``) with
known values so the logged numbers can be checked exactly.
"""

from __future__ import annotations

import glob

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from stable_baselines3 import DQN
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from llm_lb_gym.agents import (
    AGENT_NAMES, AGENTS, Agent, DoubleDQN, EpisodeMetricsCallback, HeuristicAgent, PeriodicEvalCallback,
    REINFORCEAgent, accepts_action_masks, agent_spec, load_agent, make_agent, predict_action,
)
from llm_lb_gym._validate import ConfigError

th.set_num_threads(1)

EPISODE_LEN = 5
METRICS = {
    "num_requests": 5, "completed": 5, "rejected": 0, "mean_e2e_s": 1.5, "p50_e2e_s": 1.25,
    "p90_e2e_s": 2.5, "p99_e2e_s": 3.0, "mean_ttft_s": 0.25, "p99_ttft_s": 0.5, "mean_tbt_s": 0.03,
    "p99_tbt_s": 0.06, "mean_router_wait_s": 0.125, "mean_queue_wait_s": 0.0625,
    "preemptions": 2, "makespan_s": 4.0, "throughput_rps": 1.25,
}


class FakeClusterEnv(gym.Env):
    """Fixed-length episodes; per step penalty -1, guidance -0.25, completion 2 on the last step."""

    observation_space = spaces.Box(0.0, 1.0, shape=(3,), dtype=np.float32)
    action_space = spaces.Discrete(3)  # two instances + defer

    def __init__(self) -> None:
        self.training_episode = 0
        self._t = 0

    def action_masks(self) -> np.ndarray:
        return np.ones(3, dtype=bool)

    def set_training_episode(self, k: int) -> None:
        self.training_episode = k

    def _obs(self) -> np.ndarray:
        return np.full(3, self._t / EPISODE_LEN, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {"action_mask": self.action_masks()}

    def step(self, action):
        self._t += 1
        done = self._t == EPISODE_LEN
        components = {"penalty": -1.0, "completion": 2.0 if done else 0.0, "guidance": -0.25}
        info = {"reward_components": components, "guidance_weight": 0.5, "action_mask": self.action_masks()}
        if done:
            info["metrics"] = dict(METRICS)
        return self._obs(), -1.0 + components["completion"] - 0.125, done, False, info


def _scalars(folder) -> dict[str, list[float]]:
    (event_file,) = glob.glob(f"{folder}/events.out.tfevents.*")
    acc = EventAccumulator(event_file)
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


# -- callbacks ------------------------------------------------------------------------------------

def test_episode_metrics_reach_tensorboard(tmp_path):
    vec_env = make_vec_env(FakeClusterEnv, n_envs=2, seed=0)
    model = DQN("MlpPolicy", vec_env, learning_starts=10_000, device="cpu", seed=0)
    model.set_logger(configure(str(tmp_path), ["tensorboard"]))
    callback = EpisodeMetricsCallback(episode_setter="set_training_episode")
    model.learn(40, callback=callback)  # 20 steps per env -> 4 episodes each

    assert callback.episodes_done == 8
    assert vec_env.get_attr("training_episode") == [8, 8]
    last = callback.history[-1]
    assert last["reward/penalty"] == -5.0 and last["reward/completion"] == 2.0
    assert last["reward/guidance"] == -1.25 and last["reward/guidance_weight"] == 0.5
    assert last["reward/episode_return"] == pytest.approx(-5.0 + 2.0 - 5 * 0.125)
    assert last["episode/length"] == EPISODE_LEN and last["episode/count"] == 8

    scalars = _scalars(tmp_path)
    for key, value in METRICS.items():
        assert scalars[f"sim/{key}"] == [pytest.approx(value)] * 8, key
    assert scalars["reward/penalty"] == [-5.0] * 8
    assert scalars["episode/count"] == list(map(float, range(1, 9)))


def test_periodic_eval_logs_under_eval(tmp_path):
    calls = []

    def eval_fn(model):
        calls.append(model.num_timesteps)
        return {"mean_e2e_s": float(len(calls)), "gain_vs_rr": np.float32(0.5)}

    model = DQN("MlpPolicy", FakeClusterEnv(), learning_starts=10_000, train_freq=1, device="cpu")
    model.set_logger(configure(str(tmp_path), ["tensorboard"]))
    callback = PeriodicEvalCallback(eval_fn, every_steps=10)
    model.learn(35, callback=callback)
    assert calls == [10, 20, 30, 35]  # period, then once at the end
    scalars = _scalars(tmp_path)
    assert scalars["eval/mean_e2e_s"] == [1.0, 2.0, 3.0, 4.0]
    assert scalars["eval/gain_vs_rr"] == [0.5] * 4


def test_periodic_eval_rejects_non_numbers():
    model = DQN("MlpPolicy", FakeClusterEnv(), learning_starts=10_000, device="cpu")
    with pytest.raises(TypeError, match="'policy'"):
        model.learn(10, callback=PeriodicEvalCallback(lambda m: {"policy": "rr"}, every_steps=5))
    with pytest.raises(ConfigError, match="every_steps"):
        PeriodicEvalCallback(lambda m: {}, every_steps=0)


# -- custom agents --------------------------------------------------------------------------------

class Bandit(gym.Env):
    """Arms pay Bernoulli(p); episodes of 10 pulls; ``masked`` arms are offered as invalid."""

    observation_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)

    def __init__(self, probs=(0.2, 0.8), masked=()) -> None:
        self.probs = probs
        self.action_space = spaces.Discrete(len(probs))
        self.mask = np.array([i not in masked for i in range(len(probs))])
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return np.ones(1, dtype=np.float32), {"action_mask": self.mask}

    def step(self, action):
        assert self.mask[action], "agent chose a masked arm"
        self._t += 1
        reward = float(self.np_random.random() < self.probs[action])
        return np.ones(1, dtype=np.float32), reward, False, self._t == 10, {"action_mask": self.mask}


def _p_best(agent: REINFORCEAgent) -> float:
    with th.no_grad():
        return th.softmax(agent._logits(np.ones(1)), dim=1)[0, 1].item()


def test_reinforce_learns_bandit_and_logs_episodes():
    agent = REINFORCEAgent(Bandit(), seed=0, learning_rate=0.005, episodes_per_update=2)
    p_before = _p_best(agent)
    callback = EpisodeMetricsCallback(dump=False)
    agent.learn(2_000, callback=callback)
    returns = [h["reward/episode_return"] for h in callback.history]
    assert callback.episodes_done == 200
    # A uniform policy earns 5 per episode, the best arm 8.
    assert np.mean(returns[-40:]) > np.mean(returns[:10]) + 1.5
    assert 0.3 < p_before < 0.7 and _p_best(agent) > 0.9
    assert int(agent.predict(np.ones(1))[0]) == 1


def test_reinforce_never_picks_masked_action_and_learns_best_valid():
    env = Bandit(probs=(0.1, 0.7, 0.9), masked=(2,))
    agent = REINFORCEAgent(env, seed=1, learning_rate=0.02, episodes_per_update=2)
    agent.learn(1_500)  # Bandit.step asserts on masked arms
    assert int(agent.predict(np.ones(1), action_masks=env.mask)[0]) == 1
    sampled = {int(agent.predict(np.ones(1), deterministic=False, action_masks=[True, False, False])[0])
               for _ in range(20)}
    assert sampled == {0}


def test_reinforce_logs_to_tensorboard_with_sb3_callbacks(tmp_path):
    env = gym.wrappers.TimeLimit(FakeClusterEnv(), 100)  # a wrapper, as gym.make adds
    agent = REINFORCEAgent(env, seed=0, episodes_per_update=1, tensorboard_log=str(tmp_path))
    episodes = EpisodeMetricsCallback(episode_setter="set_training_episode")
    agent.learn(20, callback=[episodes, PeriodicEvalCallback(lambda m: {"steps": m.num_timesteps}, 10)])
    assert episodes.episodes_done == 4 and env.unwrapped.training_episode == 4
    scalars = _scalars(tmp_path / "REINFORCE_1")
    assert scalars["sim/mean_e2e_s"] == [1.5] * 4 and scalars["eval/steps"] == [10.0, 20.0]
    assert len(scalars["train/loss"]) == 4 and scalars["rollout/ep_len_mean"] == [5.0] * 4


def test_reinforce_save_load_roundtrip(tmp_path):
    agent = REINFORCEAgent(Bandit(), seed=3, net_arch=[8], activation="tanh")
    agent.learn(40)
    path = tmp_path / "reinforce.pt"
    agent.save(path)
    loaded = load_agent("reinforce", path)
    obs = np.random.default_rng(0).random((5, 1), dtype=np.float32)
    assert loaded.config == agent.config and loaded.num_timesteps == 40
    with th.no_grad():
        assert th.equal(loaded._logits(obs), agent._logits(obs))
    with pytest.raises(ConfigError, match="needs an env"):
        loaded.learn(10)


def test_reinforce_config_errors_name_the_option():
    with pytest.raises(ConfigError, match="unknown REINFORCEAgent option.*lr.*allowed.*learning_rate"):
        REINFORCEAgent(Bandit(), lr=0.1)
    with pytest.raises(ConfigError, match="gamma"):
        REINFORCEAgent(Bandit(), gamma=1.5)
    with pytest.raises(ConfigError, match="activation 'swish'.*relu"):
        REINFORCEAgent(Bandit(), activation="swish")


def test_heuristic_agent(tmp_path):
    seen = []

    def first_valid(obs, info):
        seen.append(info)
        return int(np.flatnonzero(info.get("action_mask", [True]))[0])

    agent = HeuristicAgent(first_valid)
    assert agent.learn(1_000) is agent
    assert int(agent.predict(np.zeros(3))[0]) == 0
    assert int(agent.predict(np.zeros(3), action_masks=np.array([False, True, True]))[0]) == 1
    agent.predict(np.zeros(3), info={"action_mask": [False, False, True], "queue": 4})
    assert seen[-1]["queue"] == 4
    with pytest.raises(ValueError, match="action 0"):
        HeuristicAgent(lambda o, i: 0).predict(np.zeros(3), action_masks=[False, True, True])

    path = tmp_path / "rule.pkl"
    HeuristicAgent(lambda obs, info: 2).save(path)
    assert int(HeuristicAgent.load(path).predict(np.zeros(3))[0]) == 2


# -- protocol and factory -------------------------------------------------------------------------

def test_every_agent_satisfies_the_protocol():
    env = FakeClusterEnv()
    for name in AGENT_NAMES:
        assert isinstance(make_agent(name, env), Agent), name
    assert isinstance(HeuristicAgent(lambda o, i: 0), Agent)
    assert not isinstance(object(), Agent)


def test_predict_action_masks_only_agents_that_accept_masks():
    env = FakeClusterEnv()
    dqn, ddqn = make_agent("dqn", env, seed=0), make_agent("double_dqn", env, seed=0)
    assert not accepts_action_masks(dqn) and accepts_action_masks(ddqn)
    obs, _ = env.reset()
    only_defer = np.array([False, False, True])
    assert predict_action(ddqn, obs, only_defer) == 2
    assert predict_action(dqn, obs, only_defer) == predict_action(dqn, obs)
    assert predict_action(make_agent("maskable_ppo", env), obs, only_defer) == 2


def test_factory_defaults_and_plain_config_values():
    env = FakeClusterEnv()
    model = make_agent("double_dqn", env, total_timesteps=1_000, episode_steps=EPISODE_LEN)
    assert type(model) is DoubleDQN and model.batch_size == 512
    assert model.exploration_fraction == 0.1 and model.exploration_final_eps == 0.0
    assert [m.out_features for m in model.q_net.modules() if isinstance(m, th.nn.Linear)] == [64, 64, 3]
    assert any(isinstance(m, th.nn.ReLU) for m in model.q_net.modules())

    model = make_agent("dqn", env, net_arch=[16], activation="tanh", exploration_end_episode=40,
                       total_timesteps=1_000, episode_steps=EPISODE_LEN, batch_size=32)
    assert type(model) is DQN and model.batch_size == 32 and model.exploration_fraction == 0.2
    assert [m.out_features for m in model.q_net.modules() if isinstance(m, th.nn.Linear)] == [16, 3]
    assert any(isinstance(m, th.nn.Tanh) for m in model.q_net.modules())

    ppo = make_agent("maskable_ppo", env, net_arch={"pi": [8], "vf": [8]}, activation="relu", n_steps=16)
    assert ppo.policy.activation_fn is th.nn.ReLU and ppo.n_steps == 16
    assert make_agent("reinforce", env, net_arch=[4]).config.net_arch == (4,)


def test_factory_errors_list_the_choices():
    env = FakeClusterEnv()
    with pytest.raises(ConfigError, match="unknown agent 'ddqn'; allowed: double_dqn, dqn, maskable_ppo, maskable_ppo_kl, reinforce"):
        make_agent("ddqn", env)
    with pytest.raises(ConfigError, match="unknown double_dqn agent option.*learning_rte.*allowed.*learning_rate"):
        make_agent("double_dqn", env, learning_rte=1e-3)
    with pytest.raises(ConfigError, match="activation 'sigmoid'.*allowed: elu, gelu"):
        make_agent("dqn", env, activation="sigmoid")
    with pytest.raises(ConfigError, match=r"net_arch\[1\]"):
        make_agent("double_dqn", env, net_arch=[64, 0])
    with pytest.raises(ConfigError, match="action_masks"):
        make_agent("maskable_ppo", gym.make("CartPole-v1"))


def test_load_agent_roundtrip_and_masked_ppo_learns(tmp_path):
    env = FakeClusterEnv()
    model = make_agent("double_dqn", env, learning_starts=10, batch_size=8, train_freq=1, seed=0)
    model.learn(30)
    model.save(tmp_path / "ddqn")
    loaded = load_agent("double_dqn", tmp_path / "ddqn.zip")
    obs = np.random.default_rng(0).random((4, 3), dtype=np.float32)
    assert type(loaded) is DoubleDQN
    assert np.array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])

    ppo = make_agent("maskable_ppo", env, n_steps=16, batch_size=16, n_epochs=1, seed=0)
    ppo.learn(32)
    assert ppo.num_timesteps == 32


@pytest.mark.parametrize("name,attr", [("double_dqn", "replay_buffer_class"),
                                       ("maskable_ppo", "rollout_buffer_class")])
def test_models_saved_when_agents_was_a_top_level_package_load(tmp_path, monkeypatch, name, attr):
    """0.5 and before installed agents/ as the top-level ``agents``, and SB3 pickles classes by
    name: files of 0.5 and before name ``agents.replay.SemiMDPReplayBuffer`` and the like. Such a
    file still loads with ``load_agent``, and a user's own ``agents`` module is left in place."""
    import base64
    import importlib
    import json
    import sys
    import types
    import zipfile

    import llm_lb_gym  # noqa: F401  (registers LLMCluster-v0, whose discounts pick these buffers)

    agent = make_agent(name, gym.make("LLMCluster-v0", num_instances=2, num_requests=20))
    cls = getattr(agent, attr)
    module = importlib.import_module(cls.__module__)
    old_name = cls.__module__.removeprefix("llm_lb_gym.")
    assert old_name.startswith("agents.")
    with monkeypatch.context() as m:   # save as 0.5 did (pickle imports the top-level name too)
        m.setitem(sys.modules, "agents", importlib.import_module("llm_lb_gym.agents"))
        m.setitem(sys.modules, old_name, module)
        m.setattr(cls, "__module__", old_name)
        agent.save(tmp_path / name)
    path = tmp_path / f"{name}.zip"
    saved = json.loads(zipfile.ZipFile(path).read("data"))[attr][":serialized:"]
    assert old_name.encode() in base64.b64decode(saved)
    users_own = types.ModuleType("agents")   # not a package: no agents.replay in it
    monkeypatch.setitem(sys.modules, "agents", users_own)
    with pytest.raises(ModuleNotFoundError, match="agents"):
        type(agent).load(path)   # SB3 alone
    loaded = load_agent(name, path)
    assert getattr(loaded, attr) is cls
    assert sys.modules["agents"] is users_own and old_name not in sys.modules


def test_agent_specs_match_what_the_agents_do(tmp_path):
    """The registry's data must describe the real classes: mask support, model file suffix."""
    env = FakeClusterEnv()
    assert tuple(AGENTS) == AGENT_NAMES
    for name, spec in AGENTS.items():
        assert spec.name == name
        agent = make_agent(name, env)
        assert accepts_action_masks(agent) == spec.supports_masks, name
        saved = tmp_path / f"{name}{spec.file_suffix}"
        agent.save(saved)
        assert [p.name for p in tmp_path.glob(f"{name}*")] == [saved.name], name
        assert type(load_agent(name, saved)) is spec.load_class(), name
        assert not spec.single_env_only or not spec.vectorized, name
    with pytest.raises(ConfigError, match="unknown agent 'ppo'; allowed: double_dqn, dqn, maskable_ppo, maskable_ppo_kl, reinforce"):
        agent_spec("ppo")

