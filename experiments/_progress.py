"""Progress bars for the commands that run longer than a few seconds (tqdm, on stderr).

A bar is drawn only when the option allows it (``progress=true``, the default of every entry
point) and stderr is a terminal: output captured by pytest, redirected to a log, or produced
in a joblib, submitit or Ray worker never gets the control characters of a redrawn line.
Inner bars (one evaluation inside a training run or a reproduction) pass ``leave=False`` so
that only the outer bars stay on screen.
"""

from __future__ import annotations

import sys
from typing import IO, Any

try:
    from stable_baselines3.common.callbacks import BaseCallback
except ImportError:   # the light 'eval' extra (llm-lb-gym evaluate of heuristics): no training here
    BaseCallback = object


def bars_enabled(option: Any = True, stream: IO | None = None) -> bool:
    """True when ``option`` is on and ``stream`` (default: stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(option) and callable(isatty) and bool(isatty())


def progress_bar(total: int | None, desc: str, option: Any = True, unit: str = "it",
                 leave: bool = True, stream: IO | None = None):
    """A ``tqdm`` bar, disabled (every call a no-op) unless :func:`bars_enabled`."""
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    return tqdm(total=total, desc=desc, unit=unit, leave=leave, file=stream, dynamic_ncols=True,
                disable=not bars_enabled(option, stream))


def say(text: str) -> None:
    """Print a line to stdout above any bar on screen (a plain print would leave a torn bar),
    flushed so that logs keep pace."""
    from tqdm import tqdm

    tqdm.write(str(text), file=sys.stdout)
    sys.stdout.flush()


class TrainingProgressCallback(BaseCallback):
    """One bar over a training run's environment steps: the bar's own rate is steps/s, and
    its postfix the training episodes finished and the last validation mean E2E.

    ``episodes`` is the run's ``EpisodeMetricsCallback`` and ``validation`` its
    ``PeriodicEvalCallback`` (or None); list this callback after them, so each step shows
    what they have just recorded.
    """

    def __init__(self, total_steps: int, episodes, validation=None, option: Any = True,
                 desc: str = "train", leave: bool = True, stream: IO | None = None) -> None:
        super().__init__(0)
        self.total_steps = int(total_steps)
        self.episodes = episodes
        self.validation = validation
        self.option = option
        self.desc = desc
        self.leave = leave
        self.stream = stream
        self.bar = None
        self._shown: tuple = ()

    def _on_training_start(self) -> None:
        self.bar = progress_bar(self.total_steps, self.desc, self.option, unit="step", leave=self.leave,
                                stream=self.stream)
        self.bar.update(self.num_timesteps)

    def _postfix(self) -> dict[str, str]:
        post = {"episodes": str(self.episodes.episodes_done)}
        history = getattr(self.validation, "history", None)
        if history:
            post["val E2E"] = f"{history[-1][1]['mean_e2e_s']:.2f}s"
        return post

    def _on_step(self) -> bool:
        if self.bar.disable:
            return True
        self.bar.update(self.num_timesteps - self.bar.n)
        post = self._postfix()
        if tuple(post.items()) != self._shown:
            self._shown = tuple(post.items())
            self.bar.set_postfix(post, refresh=False)
        return True

    def _on_training_end(self) -> None:
        if self.bar is not None:
            if not self.bar.disable:
                self.bar.set_postfix(self._postfix(), refresh=False)
            self.bar.close()
