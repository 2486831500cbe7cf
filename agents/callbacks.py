"""TensorBoard monitoring of training: per-episode simulator metrics and periodic evaluations.

SB3 logs only returns and losses. A router is judged by latency, so every finished training
episode writes the simulator's episode metrics (``info["metrics"]`` on the final step) under
``sim/`` and the sums of the reward's components under ``reward/``: watching
``reward/guidance`` shrink while ``sim/mean_e2e_s`` keeps falling is how one sees the annealed
heuristic guidance hand over to the true objective.

Tags (TensorBoard x-axis = total environment steps across all envs):

- ``sim/<key>`` for each numeric entry of the final step's ``info["metrics"]``
- ``reward/penalty``, ``reward/completion``, ``reward/guidance``: episode sums of
  ``info["reward_components"]``; ``reward/guidance_weight``: the weight on the episode's last step;
  ``reward/episode_return``: sum of the rewards the learner saw
- ``episode/length`` (steps) and ``episode/count`` (episodes finished over all parallel envs)
- ``eval/<key>`` from :class:`PeriodicEvalCallback`

Both callbacks work with any SB3 algorithm and with ``REINFORCEAgent``.
"""

from __future__ import annotations

import numbers
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from llm_lb_gym._validate import check_int

REWARD_COMPONENTS = ("penalty", "completion", "guidance")


def _is_number(value: Any) -> bool:
    """Real scalars (Python, numpy, 0-d arrays); bools and containers are not metrics."""
    if isinstance(value, np.ndarray):
        return value.ndim == 0 and np.issubdtype(value.dtype, np.number)
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class EpisodeMetricsCallback(BaseCallback):
    """Record each finished episode's simulator metrics and reward-component sums.

    Args:
        dump: write the logger after every finished episode (step = total timesteps) so that no
            episode is overwritten by the next before SB3's own periodic dump; other values the
            algorithm recorded in the meantime are written along with it.
        episode_setter: name of an env method to call as ``method(episodes_done)`` on every env
            after each finished episode, for envs whose guidance weight decays with the global
            training-episode count rather than their own reset count (parallel envs).
        verbose: SB3 verbosity.

    Attributes:
        episodes_done: episodes finished over all parallel envs since training began.
        history: one dict of the recorded values per finished episode, in order.
    """

    def __init__(self, dump: bool = True, episode_setter: str | None = None, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.dump = dump
        self.episode_setter = episode_setter
        self.episodes_done = 0
        self.history: list[dict[str, float]] = []
        self._sums: list[dict[str, float]] = []
        self._weights: list[float | None] = []
        self._returns: list[float] = []
        self._lengths: list[int] = []

    def _ensure_envs(self, n_envs: int) -> None:
        while len(self._sums) < n_envs:
            self._sums.append(defaultdict(float))
            self._weights.append(None)
            self._returns.append(0.0)
            self._lengths.append(0)

    def _on_step(self) -> bool:
        infos = self.locals["infos"]
        dones = np.asarray(self.locals["dones"]).reshape(-1)
        rewards = self.locals.get("rewards")
        rewards = np.zeros(len(infos)) if rewards is None else np.asarray(rewards, dtype=float).reshape(-1)
        self._ensure_envs(len(infos))
        for i, info in enumerate(infos):
            for key, value in info.get("reward_components", {}).items():
                self._sums[i][key] += float(value)
            if "guidance_weight" in info:
                self._weights[i] = float(info["guidance_weight"])
            self._returns[i] += float(rewards[i])
            self._lengths[i] += 1
            if dones[i]:
                self._finish_episode(i, info)
        return True

    def _finish_episode(self, i: int, info: Mapping[str, Any]) -> None:
        self.episodes_done += 1
        values: dict[str, float] = {}
        for key, value in info.get("metrics", {}).items():
            if _is_number(value):
                values[f"sim/{key}"] = float(value)
        for key, total in self._sums[i].items():
            values[f"reward/{key}"] = total
        if self._weights[i] is not None:
            values["reward/guidance_weight"] = self._weights[i]
        values["reward/episode_return"] = self._returns[i]
        values["episode/length"] = float(self._lengths[i])
        values["episode/count"] = float(self.episodes_done)

        for key, value in values.items():
            self.logger.record(key, value)
        if self.dump:
            self.logger.dump(step=self.num_timesteps)
        self.history.append(values)

        self._sums[i] = defaultdict(float)
        self._weights[i] = None
        self._returns[i] = 0.0
        self._lengths[i] = 0
        if self.episode_setter is not None:
            env = self.training_env
            if hasattr(env, "env_method"):  # VecEnv (SB3 algorithms)
                env.env_method(self.episode_setter, self.episodes_done)
            else:  # a single gymnasium env (REINFORCEAgent)
                env.get_wrapper_attr(self.episode_setter)(self.episodes_done)


class PeriodicEvalCallback(BaseCallback):
    """Every ``every_steps`` environment steps, call ``eval_fn(model)`` and log its floats.

    ``eval_fn`` gets the model being trained and returns a mapping of names to numbers, e.g.
    mean E2E latency of the greedy policy and its improvement over round robin on held-out
    seeds; it should use its own env so the training episode is not disturbed. Values go to
    ``<prefix>/<name>`` at step = total timesteps, and to :attr:`history`.

    Args:
        eval_fn: ``model -> {name: number}``.
        every_steps: evaluation period in total environment steps (all envs together).
        at_end: also evaluate when training ends, unless that step was just evaluated.
        at_start: also evaluate before the first step (a warm-started model is then a
            candidate for the best checkpoint: RL fine-tuning can only be kept if it helps).
        prefix: TensorBoard tag prefix.
    """

    def __init__(
        self,
        eval_fn: Callable[[Any], Mapping[str, float]],
        every_steps: int,
        at_end: bool = True,
        prefix: str = "eval",
        at_start: bool = False,
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose)
        check_int("every_steps", every_steps, lo=1)
        self.eval_fn = eval_fn
        self.every_steps = int(every_steps)
        self.at_end = at_end
        self.at_start = at_start
        self.prefix = prefix
        self.history: list[tuple[int, dict[str, float]]] = []
        self._next_step = self.every_steps
        self._last_eval_step: int | None = None

    def _on_training_start(self) -> None:
        # Continue the period when learn() is called again on a trained model.
        self._next_step = (self.num_timesteps // self.every_steps + 1) * self.every_steps
        if self.at_start and self.num_timesteps == 0:
            self.evaluate()

    def _on_step(self) -> bool:
        if self.num_timesteps >= self._next_step:
            self.evaluate()
            while self._next_step <= self.num_timesteps:
                self._next_step += self.every_steps
        return True

    def _on_training_end(self) -> None:
        if self.at_end and self._last_eval_step != self.num_timesteps:
            self.evaluate()

    def evaluate(self) -> dict[str, float]:
        """Run ``eval_fn`` now, log and return its values."""
        results = self.eval_fn(self.model)
        if not isinstance(results, Mapping):
            raise TypeError(f"eval_fn must return a mapping of name -> number, got {type(results).__name__}")
        values: dict[str, float] = {}
        for key, value in results.items():
            if not _is_number(value):
                raise TypeError(f"eval_fn result {key!r}={value!r} is not a number")
            values[str(key)] = float(value)
            self.logger.record(f"{self.prefix}/{key}", float(value))
        self.logger.dump(step=self.num_timesteps)
        self.history.append((self.num_timesteps, values))
        self._last_eval_step = self.num_timesteps
        if self.verbose:
            print(f"[{self.prefix} @ {self.num_timesteps}] " + ", ".join(f"{k}={v:.4g}" for k, v in values.items()))
        return values
