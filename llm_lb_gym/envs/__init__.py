"""The Gymnasium layer: ``LLMClusterEnv`` and its observation, reward and mixing pieces."""

from .cluster_env import LLMClusterEnv
from .config import EnvConfig, ObsConfig, RewardConfig
from .mixing import MixingParams, mixing_scores

__all__ = ["LLMClusterEnv", "EnvConfig", "ObsConfig", "RewardConfig", "MixingParams", "mixing_scores"]
