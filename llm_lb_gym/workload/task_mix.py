"""The paper's synthetic workload: a mix of five NLP tasks with Llama-2-7B response lengths.

Jain et al. (arXiv 2408.13510, Table 1) report, per task, the sample count, the mean prompt and
mean decode tokens, and the share of "heavy decode" requests (decode phase >= 5 s). Requests are
drawn uniformly over tasks (the paper's setting) or with given weights; prompts over 1,000 tokens
are filtered out and prompt + decode stays within Llama-2's 4,096-token context.

Lengths come from distributions fitted to those numbers (``length_dist``):
- decode: a spliced lognormal with the table's mean and exactly its heavy share at
  ``heavy_decode_tokens`` (default 300), the remaining freedom fixed by maximum entropy;
- prompt: a lognormal with the table's mean. The table gives no prompt spread, so each task's
  log-space spread is measured on the closest analogue in the shared text corpus
  (``../shared/data/text``, WordPiece tokens; a spread in log space does not depend on a
  tokenizer's tokens-per-word ratio). Sources per task: ``TaskSpec.prompt_log_sigma``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from .._validate import ConfigError, check_int, check_range, reject_unknown
from ..limits import MAX_TOKENS
from .arrivals import ArrivalProcess, PoissonArrivals
from .batch import RequestBatch
from .length_dist import TokenLengthDist, fit_lognormal, fit_spliced

HEAVY_DECODE_S = 5.0
"""The paper's heavy-decode criterion: a decode phase of at least 5 s."""
V100_DECODE_S_PER_TOKEN = 0.0166
"""One decode step of Llama-2-7B alone on a V100: the llama2-7b-v100 latency preset's
base + per-sequence + ~1,000 context tokens (0.0155 + 3.3e-5 + 1e-3 s)."""
DEFAULT_HEAVY_DECODE_TOKENS = 300
"""5 s / 16.6 ms per token = 301 tokens, rounded: the decode length the heavy share refers to.
It is an assumption (the paper states the criterion in seconds, not tokens); a different value
refits every task to the same table."""


@dataclass(frozen=True)
class TaskSpec:
    """One task of the mix: the paper's Table 1 row plus the prompt spread we had to supply."""

    name: str
    source: str
    """Dataset the paper drew the prompts from."""
    samples: int
    """Rows of the paper's dataset for this task (for ``weights="samples"``)."""
    mean_prompt_tokens: float
    mean_decode_tokens: float
    heavy_decode_share: float
    """Share of requests whose decode phase takes >= 5 s (tokens: ``heavy_decode_tokens``)."""
    prompt_log_sigma: float
    """Standard deviation of log prompt tokens (not in the paper; see ``prompt_sigma_source``)."""
    prompt_sigma_source: str

    def __post_init__(self) -> None:
        check_int(f"{self.name}.samples", self.samples, 1)
        check_range(f"{self.name}.mean_prompt_tokens", self.mean_prompt_tokens, 1.0, lo_open=True)
        check_range(f"{self.name}.mean_decode_tokens", self.mean_decode_tokens, 1.0, lo_open=True)
        check_range(f"{self.name}.heavy_decode_share", self.heavy_decode_share, 0.0, 1.0,
                    lo_open=True, hi_open=True)
        check_range(f"{self.name}.prompt_log_sigma", self.prompt_log_sigma, 0.0, lo_open=True)


PAPER_TASKS: tuple[TaskSpec, ...] = (
    TaskSpec("translation", "Books (OPUS)", 7351, 29.09, 61.76, 0.0918, 0.70,
             "median over the 14 WMT23 translation directions in the shared corpus"),
    TaskSpec("qna", "ELI5 (Reddit)", 6988, 29.83, 334.40, 0.5818, 0.46,
             "P3 kilt_tasks_hotpotqa_straighforward_qa (a bare question in a template)"),
    TaskSpec("sentiment", "IMDb", 6564, 211.54, 142.53, 0.4101, 0.48,
             "P3 imdb_Movie_Expressed_Sentiment (an IMDb review in a template)"),
    TaskSpec("context_qna", "SQuAD", 7122, 125.16, 220.02, 0.4795, 0.33,
             "P3 adversarial_qa dbert + droberta pooled (SQuAD-style Wikipedia paragraphs)"),
    TaskSpec("entity_recognition", "WNUT17", 3304, 26.41, 64.10, 0.0871, 0.37,
             "P3 rotten_tomatoes_Movie_Expressed_Sentiment (one short sentence in a template)"),
)
"""Table 1 of the paper (samples, mean prompt, mean decode, heavy-decode share) per task."""

TASK_NAMES: tuple[str, ...] = tuple(t.name for t in PAPER_TASKS)
WEIGHT_PRESETS = ("uniform", "samples")
"""Named weightings: equal per task (the paper's sampling) or by the paper's sample counts."""


def _resolve_weights(weights, tasks: tuple[TaskSpec, ...]) -> tuple[float, ...]:
    """Normalised task probabilities from None, a preset name, a sequence or a name->weight map."""
    names = [t.name for t in tasks]
    if weights is None or weights == "uniform":
        raw = [1.0] * len(tasks)
    elif weights == "samples":
        raw = [float(t.samples) for t in tasks]
    elif isinstance(weights, str):
        raise ConfigError(f"weights={weights!r} is not valid; allowed: None, "
                          f"{', '.join(WEIGHT_PRESETS)}, a sequence of {len(tasks)} numbers, "
                          f"or a mapping over {', '.join(names)}")
    elif isinstance(weights, Mapping):
        reject_unknown("task weight", weights, names)
        raw = [weights.get(n, 0.0) for n in names]
    elif isinstance(weights, (Sequence, np.ndarray)):   # str is handled above
        raw = list(weights)
        if len(raw) != len(tasks):
            raise ConfigError(f"weights has {len(raw)} entries; allowed: exactly {len(tasks)} "
                              f"(one per task: {', '.join(names)})")
    else:
        raise ConfigError(f"weights={weights!r} is not valid; allowed: None, "
                          f"{', '.join(WEIGHT_PRESETS)}, a sequence of {len(tasks)} numbers, "
                          f"or a mapping over {', '.join(names)}")
    for name, w in zip(names, raw):
        check_range(f"weights[{name}]", w, 0.0)   # a number: "1" or None is an error, not float()ed
    raw = [float(w) for w in raw]
    total = sum(raw)
    if total <= 0:
        raise ConfigError("weights must have a positive sum; allowed: non-negative, not all zero")
    return tuple(w / total for w in raw)


@dataclass(frozen=True)
class TaskMixWorkload:
    """Requests from the paper's five-task mix with a synthetic arrival process.

    Draws per request, in this order from the caller's rng: arrival times (the arrival
    process), the task, one uniform for the prompt, one for the decode. Lengths are inverse-CDF
    transforms of those uniforms, so changing one task's distribution does not reshuffle the
    others' requests.
    """

    arrivals: ArrivalProcess = PoissonArrivals(20.0)
    """When requests arrive (paper: Poisson-like, 20 req/s)."""
    weights: object = None
    """Task probabilities: None or "uniform" (paper), "samples" (by Table 1 counts), a sequence
    in task order, or a mapping task name -> weight (missing tasks get 0)."""
    max_prompt_tokens: int = 1000
    """Prompts above this are filtered out (the prompt distribution is truncated here)."""
    max_context_tokens: int = 4096
    """Prompt + decode never exceed this: decode is clipped, as a server stops at its context."""
    heavy_decode_tokens: int | None = None
    """Decode length at which Table 1's heavy share applies; None: DEFAULT_HEAVY_DECODE_TOKENS x
    ``length_scale``, rounded (filled in at construction, so the attribute is always an int)."""
    tasks: tuple[TaskSpec, ...] = PAPER_TASKS
    """The tasks of the mix; Table 1 by default."""
    length_scale: float = 1.0
    """Multiplies every task's mean prompt and mean decode tokens (and the default
    ``heavy_decode_tokens``): the same mix, shorter. Why: Table 1's lengths are Llama-2-7B's on a
    GPU; a small model on a CPU core (SmolLM2-135M on llama.cpp, docs/serving.md) with a
    1,024-token slot replays in minutes only at about a fifth of them."""

    def __post_init__(self) -> None:
        if not hasattr(self.arrivals, "times_s"):
            raise ConfigError(f"arrivals={self.arrivals!r} must be an arrival process with times_s")
        check_int("max_prompt_tokens", self.max_prompt_tokens, 1, MAX_TOKENS - 1)
        check_int("max_context_tokens", self.max_context_tokens, self.max_prompt_tokens + 1, MAX_TOKENS)
        check_range("length_scale", self.length_scale, 0.0, 1.0e3, lo_open=True)
        given = self.heavy_decode_tokens is not None
        if not given:
            object.__setattr__(self, "heavy_decode_tokens",
                               max(2, round(DEFAULT_HEAVY_DECODE_TOKENS * self.length_scale)))
        room = self.max_context_tokens - self.max_prompt_tokens
        if given:
            check_int("heavy_decode_tokens", self.heavy_decode_tokens, 2, max(room, 2))
        if self.heavy_decode_tokens > room:
            origin = "given" if given else (f"the default {DEFAULT_HEAVY_DECODE_TOKENS} x length_scale="
                                            f"{self.length_scale:g}")
            raise ConfigError(
                f"heavy_decode_tokens={self.heavy_decode_tokens} ({origin}) does not fit after the longest "
                f"prompt: max_context_tokens={self.max_context_tokens} - max_prompt_tokens="
                f"{self.max_prompt_tokens} leaves {room}; allowed: 2..{room}. Lower max_prompt_tokens, raise "
                f"max_context_tokens, set heavy_decode_tokens, or shrink the whole mix with length_scale "
                f"(e.g. length_scale=0.2: Table 1's lengths / 5, heavy_decode_tokens 60)")
        object.__setattr__(self, "tasks", tuple(self._scaled(t) for t in self.tasks))
        if not self.tasks:
            raise ConfigError("tasks must hold at least one TaskSpec")
        object.__setattr__(self, "weights", _resolve_weights(self.weights, self.tasks))
        for t in self.tasks:
            if not 1.0 < t.mean_prompt_tokens < self.max_prompt_tokens:
                raise ConfigError(
                    f"{t.name}.mean_prompt_tokens={t.mean_prompt_tokens:.4g} (x length_scale="
                    f"{self.length_scale:g}) must lie in (1, max_prompt_tokens={self.max_prompt_tokens}); "
                    f"raise max_prompt_tokens or change length_scale")
        self.distributions()  # fit now so an unreachable table fails at construction

    def _scaled(self, t: TaskSpec) -> TaskSpec:
        """The task with its mean lengths times ``length_scale`` (the spreads and heavy share kept:
        the same shapes, shorter); itself at scale 1, so the default mix is bit for bit Table 1's."""
        if self.length_scale == 1.0:
            return t
        return replace(t, mean_prompt_tokens=t.mean_prompt_tokens * self.length_scale,
                       mean_decode_tokens=t.mean_decode_tokens * self.length_scale)

    @property
    def task_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tasks)

    def distributions(self) -> tuple[tuple[TokenLengthDist, TokenLengthDist], ...]:
        """(prompt, decode) length distribution of each task; fitted once per process (cached)."""
        max_decode = self.max_context_tokens - 1
        return tuple(
            (fit_lognormal(t.mean_prompt_tokens, t.prompt_log_sigma, self.max_prompt_tokens),
             fit_spliced(t.mean_decode_tokens, t.heavy_decode_share, self.heavy_decode_tokens,
                         max_decode))
            for t in self.tasks)

    def sample(self, rng: np.random.Generator, num_requests: int) -> RequestBatch:
        check_int("num_requests", num_requests, 0)
        n = int(num_requests)
        arrival_s = self.arrivals.times_s(rng, n)
        task = rng.choice(len(self.tasks), size=n, p=np.asarray(self.weights))
        u_prompt = rng.random(n)
        u_decode = rng.random(n)
        prompt = np.empty(n, dtype=np.int64)
        decode = np.empty(n, dtype=np.int64)
        for j, (prompt_dist, decode_dist) in enumerate(self.distributions()):
            rows = task == j
            prompt[rows] = prompt_dist.sample(u_prompt[rows])
            decode[rows] = decode_dist.sample(u_decode[rows],
                                              cap_tokens=self.max_context_tokens - prompt[rows])
        return RequestBatch.from_arrays(
            arrival_s, prompt, decode, task, self.task_names,
            meta={"workload": "task_mix", "weights": self.weights,
                  "heavy_decode_tokens": self.heavy_decode_tokens,
                  "max_prompt_tokens": self.max_prompt_tokens,
                  "max_context_tokens": self.max_context_tokens, "length_scale": self.length_scale})
