"""llm_lb_gym: a vLLM-faithful LLM cluster simulator and the ``LLMCluster-v0`` routing env.

Importing the package registers ``LLMCluster-v0`` with Gymnasium (Gymnasium 1.x reads no entry
points). Registration is idempotent, so re-imports and reloads are harmless.
"""

from __future__ import annotations

import gymnasium as gym

__version__ = "0.7.0"   # read by pyproject.toml (dynamic version)

ENV_ID = "LLMCluster-v0"
MAX_EPISODE_STEPS = 200_000
"""TimeLimit: far above a 2,000-request episode's steps (about one per request plus defers), so
only a router that defers forever is truncated."""

if ENV_ID not in gym.registry:
    # FinalMetrics sits outside TimeLimit (gym.make applies additional_wrappers after it), so a
    # truncated episode's last info also holds "metrics".
    gym.register(id=ENV_ID, entry_point="llm_lb_gym.envs.cluster_env:LLMClusterEnv",
                 max_episode_steps=MAX_EPISODE_STEPS,
                 additional_wrappers=(gym.envs.registration.WrapperSpec(
                     "FinalMetrics", "llm_lb_gym.envs.wrappers:FinalMetrics", {}),))

__all__ = ["ENV_ID", "__version__"]
