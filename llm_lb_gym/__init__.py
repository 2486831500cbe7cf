"""llm_lb_gym: a vLLM-faithful LLM cluster simulator and the ``LLMCluster-v0`` routing env.

Importing the package registers ``LLMCluster-v0`` (the paper's setting) and one id per named
regime (``ENV_IDS``: ``LLMCluster-NearCapacity-v0``, ``LLMCluster-Overload-v0``,
``LLMCluster-Trace-v0``; their values live in ``llm_lb_gym/envs/presets.py``) with Gymnasium
(Gymnasium 1.x reads no entry points). Registration is idempotent, so re-imports and reloads are
harmless.
"""

from __future__ import annotations

import gymnasium as gym

__version__ = "0.7.0"   # read by pyproject.toml (dynamic version)

ENV_ID = "LLMCluster-v0"
ENV_IDS = {
    "LLMCluster-NearCapacity-v0": "near_capacity",
    "LLMCluster-Overload-v0": "overload",
    "LLMCluster-Trace-v0": "trace",
}
"""Registered id -> preset name (``llm_lb_gym.envs.presets.PRESETS``, which names the same id;
a test checks they agree). Kept here so ``import llm_lb_gym`` registers them without importing
the env."""
CONDITION_ENV_IDS = {
    "LLMCluster-Train-v0": "train",
    "LLMCluster-TrainSynthetic-v0": "train_synthetic",
}
"""Registered id -> condition space (``llm_lb_gym.suite.suites.SPACES``): an env that draws a
fresh training condition (workload, load, predictor accuracy, cluster) at every reset
(``llm_lb_gym.suite.env.ConditionEnv``), for RL over the distribution the main job searches."""
MAX_EPISODE_STEPS = 200_000
"""TimeLimit: far above a 2,000-request episode's steps (about one per request plus defers), so
only a router that defers forever is truncated."""

for _id, _preset in ((ENV_ID, None), *ENV_IDS.items()):
    if _id not in gym.registry:
        # FinalMetrics sits outside TimeLimit (gym.make applies additional_wrappers after it), so a
        # truncated episode's last info also holds "metrics".
        gym.register(id=_id, entry_point="llm_lb_gym.envs.cluster_env:LLMClusterEnv",
                     max_episode_steps=MAX_EPISODE_STEPS,
                     kwargs={} if _preset is None else {"preset": _preset},
                     additional_wrappers=(gym.envs.registration.WrapperSpec(
                         "FinalMetrics", "llm_lb_gym.envs.wrappers:FinalMetrics", {}),))
for _id, _space in CONDITION_ENV_IDS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point="llm_lb_gym.suite.env:ConditionEnv",
                     max_episode_steps=MAX_EPISODE_STEPS, kwargs={"space": _space},
                     additional_wrappers=(gym.envs.registration.WrapperSpec(
                         "FinalMetrics", "llm_lb_gym.envs.wrappers:FinalMetrics", {}),))


def engine_info() -> dict:
    """Which simulator engine runs: ``{"engine": "compiled" | "pure-python", "kernels":
    "compiled" | "python", "reason": why pure (None when compiled), "build_failure": what the
    install's compile said, if it failed}``. The compiled build is about 1.8x faster and gives
    bit-identical results (docs/install.md)."""
    from .envs._kernels import compiled_kernels
    from .sim._compiled import engine_info as info

    return {"kernels": "compiled" if compiled_kernels() is not None else "python", **info()}


__all__ = ["CONDITION_ENV_IDS", "ENV_ID", "ENV_IDS", "__version__", "engine_info"]
