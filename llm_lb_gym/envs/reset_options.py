"""What ``LLMClusterEnv.reset(options=...)`` and ``set_training_episode`` accept, checked like
the env's constructor options: a key that does not exist is an error naming the allowed keys,
and a value of the wrong type or range names the option and the allowed values.

Silently accepting ``options={"guidance_epsiode": 3}`` (a typo: the reward would keep its old
weight), a string, NaN or a fractional episode (``int()`` would truncate it) or a negative one
(the guidance weight ``scale * exp(-decay * k)`` grows without bound: 5e21 at k = -100) would
change the reward without a word.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._validate import ConfigError, check_int, reject_unknown
from ..limits import MAX_TRAINING_EPISODE
from ..workload.batch import RequestBatch

RESET_OPTIONS = ("batch", "guidance_episode")
"""``batch``: a ``RequestBatch`` to replay instead of sampling the workload (1 to
``num_requests`` requests); ``guidance_episode``: the annealing counter k for this episode on."""


def check_episode(name: str, k) -> int:
    """The training-episode counter ``k`` as an int: an integer (Python or numpy, not a bool,
    float or string) in [0, ``limits.MAX_TRAINING_EPISODE``]."""
    check_int(name, k, 0, MAX_TRAINING_EPISODE)
    return int(k)


def check_reset_options(options, num_requests: int) -> dict:
    """``options`` of ``reset`` as a dict, every key and value checked (None: no options)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"reset options={options!r} must be a dict (or None); allowed keys: "
                          f"{', '.join(RESET_OPTIONS)}")
    reject_unknown("reset", options, RESET_OPTIONS)
    out = dict(options)
    if "guidance_episode" in out:
        out["guidance_episode"] = check_episode("reset options guidance_episode",
                                                out["guidance_episode"])
    if "batch" in out:
        batch = out["batch"]
        if not isinstance(batch, RequestBatch):
            raise ConfigError(f"reset options batch={type(batch).__name__} must be a "
                              "llm_lb_gym.workload.RequestBatch")
        if not 1 <= len(batch) <= num_requests:
            raise ConfigError(f"reset options batch has {len(batch)} requests; allowed: 1 to "
                              f"num_requests={num_requests} (the episode the env was built for)")
    return out
