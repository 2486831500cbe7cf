"""A synthetic workload with shared prefixes: multi-turn conversations behind system prompts.

What production LLM gateways route on: many requests start with the same tokens. Here each
conversation opens with one of ``num_system_prompts`` system prompts (its task), and every
turn's prompt is the whole conversation so far (system prompt, earlier user messages and
responses) plus a new user message, so turn t+1 extends turn t's prompt. Each request carries
the chained hash ids of its prompt's blocks of ``hash_block_tokens`` tokens
(``RequestBatch.prefix_hashes``), as a real engine would compute them from the token ids:

- the system prompt's full blocks carry ids shared by every conversation with that prompt;
- a turn's blocks that lie wholly inside the previous turn's prompt carry that turn's ids;
- every other block gets a fresh id. This includes the blocks holding the previous response:
  the engine caches prompt blocks only (docs/prefix_caching.md), so the previous response is
  computed as part of the next prompt and cached from then on. (vLLM also caches full blocks
  of generated tokens, so it would reuse the previous response as well: hit rates here are a
  lower bound on vLLM's for the same conversations.)

Arrivals: conversations start at the times of the arrival process stretched by the number
of turns, so that the process's rate is the request rate; turn t+1 arrives a think time
(exponential, mean ``think_time_s``) after turn t arrives (open loop: the workload cannot
know when the response ends, which depends on the router). A conversation ends early when
its next turn would not fit ``max_context_tokens``. Lengths of user messages and responses
are lognormal with the given means (log-space spread ``length_log_sigma``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validate import check_int, check_range
from ..limits import MAX_TOKENS
from .arrivals import ArrivalProcess, PoissonArrivals
from .batch import RequestBatch


@dataclass(frozen=True)
class ConversationWorkload:
    """Multi-turn conversations sharing per-task system prompts (prefix-caching workloads)."""

    arrivals: ArrivalProcess = PoissonArrivals(20.0)
    """Request arrival process (conversations start at its times times ``turns_per_conversation``)."""
    num_system_prompts: int = 8
    """Distinct system prompts (tasks); each conversation draws one uniformly."""
    system_prompt_tokens: int = 512
    """Tokens of every system prompt."""
    turns_per_conversation: int = 4
    """Turns of a conversation (fewer when the context fills up)."""
    user_message_tokens: float = 150.0
    """Mean tokens of a user message."""
    response_tokens: float = 200.0
    """Mean tokens of a response (the request's decode length)."""
    length_log_sigma: float = 0.6
    """Spread of log message and response lengths."""
    think_time_s: float = 30.0
    """Mean time between a turn's arrival and the next turn's."""
    max_context_tokens: int = 4096
    """A turn's prompt + response stays within this (the engine's context window)."""
    hash_block_tokens: int = 16
    """Tokens per hash block; a multiple of the engine's block size (16 by default)."""

    def __post_init__(self) -> None:
        if not hasattr(self.arrivals, "times_s"):
            from .._validate import ConfigError
            raise ConfigError(f"arrivals={self.arrivals!r} must be an arrival process with times_s")
        check_int("num_system_prompts", self.num_system_prompts, 1, 100_000)
        check_int("system_prompt_tokens", self.system_prompt_tokens, 0, MAX_TOKENS)
        check_int("turns_per_conversation", self.turns_per_conversation, 1, 1000)
        check_range("user_message_tokens", self.user_message_tokens, 1.0)
        check_range("response_tokens", self.response_tokens, 1.0)
        check_range("length_log_sigma", self.length_log_sigma, 0.0, 3.0)
        check_range("think_time_s", self.think_time_s, 0.0, 1e6)
        check_int("max_context_tokens", self.max_context_tokens, 2, MAX_TOKENS)
        check_int("hash_block_tokens", self.hash_block_tokens, 1, MAX_TOKENS)
        if self.system_prompt_tokens + 2 > self.max_context_tokens:
            from .._validate import ConfigError
            raise ConfigError(f"system_prompt_tokens={self.system_prompt_tokens} leaves no room in "
                              f"max_context_tokens={self.max_context_tokens}; allowed: <= "
                              f"max_context_tokens - 2")

    @property
    def task_names(self) -> tuple[str, ...]:
        return tuple(f"system_prompt_{i}" for i in range(self.num_system_prompts))

    def _length(self, rng: np.random.Generator, mean: float) -> int:
        s = self.length_log_sigma
        return max(1, int(round(rng.lognormal(np.log(mean) - s * s / 2, s))))

    def sample(self, rng: np.random.Generator, num_requests: int) -> RequestBatch:
        check_int("num_requests", num_requests, 0)
        n, T, H = int(num_requests), self.turns_per_conversation, self.hash_block_tokens
        S = self.system_prompt_tokens
        sys_ids = [tuple(range(i * (S // H), (i + 1) * (S // H))) for i in range(self.num_system_prompts)]
        fresh = self.num_system_prompts * (S // H)
        arr, p, d, task, chains = [], [], [], [], []
        starts = self.arrivals.times_s(rng, max(1, -(-n // T))) * T
        c = 0
        while len(arr) < n:
            if c == len(starts):   # conversations cut short by the context: draw more starts
                more = self.arrivals.times_s(rng, len(starts)) * T
                starts = np.concatenate([starts, starts[-1] + more + 1e-9])
            t, k = float(starts[c]), int(rng.integers(self.num_system_prompts))
            c += 1
            context, chain = S, list(sys_ids[k])
            for _ in range(T):
                user = self._length(rng, self.user_message_tokens)
                resp = self._length(rng, self.response_tokens)
                prompt = context + user
                if prompt + resp > self.max_context_tokens:
                    break
                keep = min(len(chain), prompt // H)   # blocks wholly inside the last prompt
                chain = chain[:keep]
                need = -(-prompt // H)
                chain += range(fresh, fresh + need - keep)
                fresh += need - keep
                arr.append(t)
                p.append(prompt)
                d.append(resp)
                task.append(k)
                chains.append(tuple(chain))
                context = prompt + resp
                chain = chain[:prompt // H]   # the partial last block is not shared
                t += float(rng.exponential(self.think_time_s)) if self.think_time_s else 0.0
        order = np.argsort(np.asarray(arr), kind="stable")[:n]
        return RequestBatch.from_arrays(
            np.asarray(arr)[order], np.asarray(p)[order], np.asarray(d)[order],
            np.asarray(task)[order], self.task_names,
            meta={"workload": "conversation"},
            prefix_hashes=[chains[i] for i in order], hash_block_tokens=H)
