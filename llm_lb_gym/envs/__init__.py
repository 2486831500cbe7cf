"""The Gymnasium layer: ``LLMClusterEnv`` and its observation and reward pieces.

``MixingParams`` and ``mixing_scores`` live in ``llm_lb_gym.routers.mixing`` (the mixing-greedy
router and the reward share them); they are re-exported here because ``RewardConfig.mixing``
takes a ``MixingParams``.
"""

from ..routers.mixing import MixingParams, mixing_scores
from .cluster_env import LLMClusterEnv
from .config import EnvConfig, ObsConfig, RewardConfig

__all__ = ["LLMClusterEnv", "EnvConfig", "ObsConfig", "RewardConfig", "MixingParams", "mixing_scores"]
