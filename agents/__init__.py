"""Agents for routing in ``LLMCluster-v0``: Double DQN, REINFORCE, heuristic, callbacks, factory.

Quick start::

    import gymnasium as gym, llm_lb_gym
    from llm_lb_gym.agents import make_agent, EpisodeMetricsCallback
    env = gym.make("LLMCluster-v0")
    agent = make_agent("double_dqn", env, total_timesteps=200_000, episode_steps=5_000,
                       tensorboard_log="runs/")
    agent.learn(200_000, callback=EpisodeMetricsCallback())
"""

from llm_lb_gym.extras import require

# the agents are torch and Stable-Baselines3: say which extra installs them
require("rl", "llm_lb_gym.agents", modules=("torch", "stable_baselines3", "sb3_contrib"))

from llm_lb_gym.agents.base import Agent, accepts_action_masks, predict_action
from llm_lb_gym.agents.callbacks import EpisodeMetricsCallback, PeriodicEvalCallback
from llm_lb_gym.agents.double_dqn import DoubleDQN
from llm_lb_gym.agents.factory import AGENT_NAMES, agent_class, load_agent, make_agent
from llm_lb_gym.agents.heuristic_agent import HeuristicAgent
from llm_lb_gym.agents.nets import ACTIVATIONS, activation_class
from llm_lb_gym.agents.paper_defaults import PaperDQNDefaults, paper_kwargs
from llm_lb_gym.agents.registry import AGENTS, AgentSpec, agent_spec
from llm_lb_gym.agents.reinforce import REINFORCEAgent, REINFORCEConfig

__all__ = [
    "ACTIVATIONS",
    "AGENTS",
    "AGENT_NAMES",
    "Agent",
    "AgentSpec",
    "DoubleDQN",
    "EpisodeMetricsCallback",
    "HeuristicAgent",
    "PaperDQNDefaults",
    "PeriodicEvalCallback",
    "REINFORCEAgent",
    "REINFORCEConfig",
    "accepts_action_masks",
    "activation_class",
    "agent_class",
    "agent_spec",
    "load_agent",
    "make_agent",
    "paper_kwargs",
    "predict_action",
]
