"""The server's frontend: the CPU work an API server does per request, ahead of the engine.

Why: a vLLM (or llama.cpp) server is not only its forward passes. Its API process parses each
HTTP request, renders the chat template, tokenizes the prompt and hands the request to the
engine; for every token it detokenizes and writes a stream chunk. That work runs on one CPU
thread (vLLM's asyncio API server; llama.cpp's HTTP threads share the cores with its compute),
so with many requests in flight it queues: 1,000 requests of 128 prompt / 4 output tokens take
about as long on an H100 as on an A100 (GPUStack's vLLM 0.11 measurements, ``calibration/``),
and a lone request's first token carries milliseconds that no forward pass explains. Without a
term for it the simulator predicted such runs 36-75% too short (issue 33).

The model (``engine.frontend``; off by default, so every existing preset computes exactly what
it did before): one processor-sharing CPU server per instance. Its jobs share the CPU equally
(an event loop interleaving coroutines), and there are three per request:

- **input**, ``delay_s`` after routing (a latency that takes no CPU: the network and IPC hops):
  ``request_s + prompt_token_s x prompt tokens`` (parsing, template,
  validation, hand-off; tokenization proportional to the prompt). The request joins the
  engine's waiting queue when this completes; until then it counts as waiting (the router's
  view, observations and the penalty see it) but cannot be scheduled;
- **first chunk**, when the engine emits the first token: ``first_token_s`` (response headers
  and the first chunk). Its completion is the first token the client sees;
- **the further tokens** (``output_token_s`` each: detokenization and its stream chunk) are not
  a job of their request: they are done as the engine makes them, a share of the CPU during
  each decode iteration (``output_stream.py``, reported by the engine as it runs its
  iterations), which the jobs above do not get. The client has the whole response when the
  engine made its last token and its first chunk is out. Why not one job per request (the
  model until 2026-12-07): booked from the first token, a request's whole output work ran at
  once, 62 ms of CPU for 16 requests of 1,024 tokens sent together, just when the next
  requests' inputs needed it (silybench's 128 / 1,024 closed loops: p95 TTFT +86% .. +90%);
  booked at the end it delayed a lone request's end by its whole length. A job per token
  would cost an event per token.

Client-side times go to ``RequestTable.seen_first_token_s`` / ``seen_finish_s``; the metrics
use them for TTFT, E2E and TBT (``metrics.request_latencies``). The engine's own first-token
and finish times stay where they were (the env's completion reward and SLO counting read them
when they happen).

Processor sharing with virtual time: ``V`` grows at ``1 / n`` per CPU second left to the jobs
(``OutputStream.free``: every second less the output work's share) with ``n`` jobs in service,
so a job of work ``w`` arriving at virtual time ``V0`` completes when ``V`` reaches ``V0 + w``;
the next completion is the smallest such finish (a heap), when ``(F - V) n`` free CPU seconds
have passed (``OutputStream.when``).
The state only ever moves forward to times no later than any event still to be reported: jobs
arrive in a pending heap and are applied in time order as the server is advanced (the engine
advances it to each iteration's start, ``Engine._fe_release``), so a first token reported at an
iteration's end does not run ahead of a request routed before that end.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

import numpy as np

from .._validate import ConfigError, check_range, lookup
from .output_stream import OutputStream

INF = math.inf
_INPUT, _FIRST, _BACKLOG = 0, 1, 2


@dataclass(frozen=True, kw_only=True)
class FrontendModel:
    """CPU seconds of the API server's work per request, per prompt token and per output token
    (all >= 0; one CPU shared by the server's jobs, ``frontend.py``)."""

    delay_s: float = 0.0
    """Per request before its input job, taking no CPU: the network and IPC hops, waiting for
    the engine's loop (a lone request's TTFT carries it; the throughput of a flood does not)."""
    request_s: float = 0.0
    """Per request at arrival: HTTP parsing, validation, chat template, hand-off to the engine."""
    prompt_token_s: float = 0.0
    """Per prompt token at arrival: tokenization."""
    first_token_s: float = 0.0
    """When the first token is out: response headers and the first stream chunk."""
    output_token_s: float = 0.0
    """Per further output token: detokenization and its stream chunk, done during the decode
    iteration that made the token (``output_stream.py``)."""
    input_workers: int = 0
    """How many requests' input work runs at once: 0 = all of them (processor sharing among
    every job), k >= 1 = at most k, the others waiting in arrival order. Why: a Python API
    server does a request's prompt work (parsing, template, tokenization) in one go between its
    awaits, and vLLM tokenizes on a single worker thread (``serving_engine.py``'s
    ``ThreadPoolExecutor(max_workers=1)``, vllm-project/vllm#25301), so requests that arrive
    together are prepared one after another, not all at the same slow pace. The difference
    shows in a closed loop of identical requests: shared equally, every input of a round
    finishes at the round's end and the requests stay in lockstep (each waits for all the
    others); one at a time, the first is ready after one input's work and the rounds spread
    out. The first chunks and the streamed tokens' output work still share the CPU with it.
    Measured (docs/calibration.md): vLLM 0.11's chat floods reject 1 (their first tokens come
    late together, not spread evenly), so the shipped frontends keep 0; the option is there
    for servers that do prepare one request at a time, and for ``validate --input-workers``."""

    wake_s: tuple[tuple[float, float], ...] = ()
    """Extra delay of a request that reaches an idle server, by how long it was idle: points
    ``(idle seconds, extra seconds)``, idle increasing, linear between them and flat beyond
    (empty: none). Why: a CPU server woken from idleness (a vCPU the hypervisor descheduled,
    cold caches, the threads' wake-ups) answers a lone request later than one profiled back to
    back, more the longer it slept (measured on llama.cpp by ``calibrate_llamacpp profile``;
    docs/serving.md). "Idle": no request of the instance in flight or in the frontend and its
    last iteration over; the idle time runs from the end of that iteration."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "wake_s", _wake_points(self.wake_s))
        for f in fields(self):
            if f.name == "wake_s":
                continue
            if f.name == "input_workers":
                if isinstance(self.input_workers, bool) or not isinstance(self.input_workers, int) or self.input_workers < 0:
                    raise ConfigError(f"frontend.input_workers={self.input_workers!r}; allowed: an integer >= 0 "
                                      "(0 = every request's input work at once)")
            else:
                check_range(f"frontend.{f.name}", getattr(self, f.name), 0.0)

    def input_s(self, prompt_tokens: int) -> float:
        return self.request_s + self.prompt_token_s * prompt_tokens

    def seen_s(self, engine_s, prompt_tokens):
        """A lone request's time in the engine (``engine_s``: its TTFT, or its whole latency) as
        its client sees it: after the delay and its input work. Its output work (first chunk,
        further tokens) is left out: on an idle server it runs while the request decodes and
        ends before the engine does. Scalars or arrays (the SLO's isolated TTFT and the
        reward's ideal latency T_j add it alike)."""
        return engine_s + self.delay_s + self.input_s(np.asarray(prompt_tokens, np.float64))

    def wake_delay_s(self, idle_s: float) -> float:
        """The extra delay of a request reaching the server after ``idle_s`` idle (``wake_s``)."""
        pts = self.wake_s
        if not pts:
            return 0.0
        if idle_s <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if idle_s <= x1:
                return y0 + (y1 - y0) * (idle_s - x0) / (x1 - x0)
        return pts[-1][1]

    def describe(self) -> str:
        out = ", ".join(f"{f.name}={getattr(self, f.name):.4g}" for f in fields(self) if f.name != "wake_s")
        if self.wake_s:
            out += ", wake_s=" + " ".join(f"{x:g}s:{y * 1e3:.1f}ms" for x, y in self.wake_s)
        return out


def _wake_points(value) -> tuple[tuple[float, float], ...]:
    """``wake_s`` as a validated tuple of (idle seconds, extra seconds) points."""
    allowed = "allowed: a list of [idle seconds, extra seconds] pairs, idle strictly increasing, both >= 0"
    try:
        pts = tuple((x, y) for x, y in value)
    except (TypeError, ValueError):
        raise ConfigError(f"frontend.wake_s={value!r}; {allowed}") from None
    for i, (x, y) in enumerate(pts):
        check_range(f"frontend.wake_s[{i}] idle seconds", x, 0.0)
        check_range(f"frontend.wake_s[{i}] extra seconds", y, 0.0)
        if i and x <= pts[i - 1][0]:
            raise ConfigError(f"frontend.wake_s: idle seconds {x!r} after {pts[i - 1][0]!r}; {allowed}")
    return tuple((float(x), float(y)) for x, y in pts)


FRONTEND_COSTS: tuple[str, ...] = tuple(f.name for f in fields(FrontendModel) if f.type == "float")
"""The fields that are times (the serving fit moves these; ``input_workers`` is structure)."""


FRONTENDS: dict[str, FrontendModel] = {}
"""Named frontend models (``engine.frontend: <name>``); their coefficients and sources are in
``calibration/frontend_fit.py`` and docs/calibration.md."""


def register_frontend(name: str, model: FrontendModel) -> None:
    FRONTENDS[name] = model


def resolve_frontend(value: Any, where: str = "engine.frontend") -> FrontendModel | None:
    """None, a registered name, a ``FrontendModel`` or a mapping of its fields."""
    if value is None or isinstance(value, FrontendModel):
        return value
    if isinstance(value, str):
        return lookup("frontend", FRONTENDS, value)
    if isinstance(value, Mapping):
        names = [f.name for f in fields(FrontendModel)]
        unknown = sorted(str(k) for k in value if k not in names)
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(names)}")
        try:
            return FrontendModel(**dict(value))
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("frontend.", f"{where}.", 1)) from None
    raise ConfigError(f"{where}={value!r} must be null, a frontend name ({', '.join(FRONTENDS) or 'none registered'}) "
                      "or a mapping of delay_s, request_s, prompt_token_s, first_token_s, output_token_s, input_workers")


class Frontend:
    """One instance's frontend server at run time (processor sharing, see the module doc)."""

    def __init__(self, model: FrontendModel, table, stream_class=OutputStream):
        self.model = model
        self.table = table
        self.t = 0.0          # the time the state is at
        self.V = 0.0          # virtual time: the work each job in service has received
        self.jobs: list = []      # (virtual finish, seq, kind, rid), the jobs in service
        self.pending: list = []   # (time, seq, kind, rid, work), reported but not yet applied
        self.seq = 0
        self.n_input = 0      # input jobs pending, queued or in service
        self.input_queue: deque = deque()   # (seq, rid, work): input jobs waiting for a worker
        self.inputs_running = 0             # input jobs in service (<= model.input_workers if > 0)
        self.ready: list[tuple[float, int]] = []   # (input completed at, request), not yet taken
        self.cancelled: set[int] = set()
        self.out = stream_class(model.output_token_s)   # the streamed tokens' share of the CPU
        self.source = None   # the engine, asked for the decode iterations run so far (Engine._fe_flush)
        self.last_backlog = -1                  # the output backlog job reported last (its seq)
        self.backlog_waiters: dict[int, list[int]] = {}   # open backlog job -> requests whose end waits for it
        table.frontends.append(self)
        table.client_columns()

    # --- jobs reported by the engine ---------------------------------------------------------
    def _report(self, time: float, kind: int, rid: int) -> None:
        heapq.heappush(self.pending, (time, self.seq, kind, rid, 0.0))
        self.seq += 1

    def arrive(self, rid: int, now: float, wake_s: float = 0.0) -> None:
        """Request ``rid`` routed here at ``now``; ``wake_s``: the extra delay of a server woken
        from idleness (``FrontendModel.wake_delay_s``, the engine knows how long it was idle)."""
        assert now >= self.t, f"frontend: a request routed at {now} behind the server's clock {self.t}"
        self.n_input += 1
        self._report(now + self.model.delay_s + wake_s, _INPUT, rid)

    def first_token(self, rid: int, time: float) -> None:
        self._report(time, _FIRST, rid)

    def stream(self, t0: float, a: float, c: float, j0: int, j1: int, n: int) -> None:
        """The engine ran decode iterations ``j0 .. j1 - 1`` of a run starting at ``t0``
        (iteration ``j`` at ``t0 + j a + c j (j - 1) / 2``, lasting ``a + c j``), each giving
        ``n`` requests a token: their output work (``output_stream.py``)."""
        if not (self.jobs or self.pending):   # idle: what ran before can concern no job to come
            self.out.runs.clear()             # (a later report is at the engine's clock or after)
        for time, work in self.out.add(t0, a, c, j0, j1, n):
            heapq.heappush(self.pending, (time, self.seq, _BACKLOG, -1, work))
            self.backlog_waiters[self.seq] = []
            self.last_backlog = self.seq
            self.seq += 1

    def finished(self, rid: int, time: float) -> None:
        """The engine produced the last token at ``time``: the client has the response then,
        or when its first chunk is out if that is later, or, while the output work is behind
        (``output_stream.py``), when the last backlog reported by then is done."""
        tb = self.table
        first = tb.seen_first_token_s[rid]
        tb.seen_finish_s[rid] = first if first > time else time   # NaN first: its chunk moves this up
        waiters = self.backlog_waiters.get(self.last_backlog)
        if waiters is not None:
            waiters.append(rid)

    def cancel(self, rid: int) -> None:
        """An aborted request still in its input job: the work is spent, nothing is handed on."""
        self.cancelled.add(rid)

    # --- time ---------------------------------------------------------------------------------
    def next_event_s(self) -> float:
        """When the state next changes if nothing more is reported (a completion or a pending
        job's arrival); INF if nothing is left."""
        tc = self.out.when(self.t, (self.jobs[0][0] - self.V) * len(self.jobs)) if self.jobs else INF
        tp = self.pending[0][0] if self.pending else INF
        return tc if tc < tp else tp

    def next_release_s(self) -> float:
        """A lower bound of the next input completion: a completed one not yet taken, else the
        next event while an input job is in the frontend (INF when none: then nothing can reach
        the engine until a new route)."""
        if self.ready:
            return self.ready[0][0]
        return self.next_event_s() if self.n_input else INF

    def advance(self, X: float) -> None:
        """Apply every arrival and completion up to time ``X``, in time order."""
        if self.source is not None:   # (the object, not its bound method: copies stay paired)
            self.source._fe_flush()
        jobs, pending, model, tb, out = self.jobs, self.pending, self.model, self.table, self.out
        while True:
            n = len(jobs)
            tp = pending[0][0] if pending else INF
            if n:
                amount = (jobs[0][0] - self.V) * n
                tc = self.t + amount   # a lower bound (the output stream only takes CPU away) ...
                if tc < tp and tc <= X:
                    tc = out.when(self.t, amount)   # ... the exact time only where it decides
            else:
                tc = INF
            if (tc > X and tp > X) or not (n or pending):
                break
            if tp <= tc:
                time, seq, kind, rid, w = heapq.heappop(pending)
                if n and time > self.t:
                    self.V += out.free(self.t, time) / n
                self.t = max(self.t, time)
                if kind == _INPUT:
                    w = model.input_s(tb.prompt[rid])
                    if model.input_workers and self.inputs_running >= model.input_workers:
                        self.input_queue.append((seq, rid, w))
                        continue
                    self.inputs_running += 1
                elif kind == _FIRST:
                    w = model.first_token_s
                heapq.heappush(jobs, (self.V + w, seq, kind, rid))   # (_BACKLOG: its work came with it)
            else:
                F, jseq, kind, rid = heapq.heappop(jobs)
                self.V = F
                self.t = tc
                if kind == _INPUT:
                    self.n_input -= 1
                    self.inputs_running -= 1
                    if self.input_queue:   # the next waiting input starts now (V is at this time)
                        qseq, qrid, qw = self.input_queue.popleft()
                        heapq.heappush(jobs, (self.V + qw, qseq, _INPUT, qrid))
                        self.inputs_running += 1
                    if rid in self.cancelled:
                        self.cancelled.discard(rid)
                    else:
                        self.ready.append((tc, rid))
                elif kind == _FIRST:
                    tb.seen_first_token_s[rid] = tc
                    if tb.seen_finish_s[rid] < tc:   # the engine ended before the first chunk was out
                        tb.seen_finish_s[rid] = tc
                else:   # an output backlog done: the responses whose last token was behind it
                    for r in self.backlog_waiters.pop(jseq):
                        if tb.seen_finish_s[r] < tc:
                            tb.seen_finish_s[r] = tc
        if X > self.t and X != INF:
            if jobs:
                self.V += out.free(self.t, X) / len(jobs)
            self.t = X
        out.prune(self.t)

    def take_ready(self, t: float) -> list[int]:
        """The requests whose input work ended by ``t``, in the order it ended (the frontend
        may have been advanced past ``t`` by a driver reading client-side times)."""
        ready = self.ready
        k = 0
        while k < len(ready) and ready[k][0] <= t:
            k += 1
        out = [rid for _, rid in ready[:k]]
        del ready[:k]
        return out

    def flush(self) -> None:
        """Run every job to completion (the episode's end: client-side times for the metrics)."""
        self.advance(INF)


# Printed by `llm-lb-gym validate --fit` (calibration/serving.py): vLLM 0.11's OpenAI API server,
# chat completions (GPUStack's runs: 1,000 requests of 128 / 4 tokens at once on an A100 and an H100,
# Qwen3-8B at concurrency 1-8). docs/calibration.md.
register_frontend("vllm-v1-api", FrontendModel(delay_s=0.0319, request_s=0.01229, prompt_token_s=9.993e-08,
                                               first_token_s=0.0005731, output_token_s=3.786e-06))
# vLLM's completions endpoint (/v1/completions: the prompt as sent, no chat template), fitted with
# the chat one: its per-request costs on kvcached's H100 runs (vLLM 0.19, Qwen3-0.6B, 500 requests of
# 512 / 128 tokens at once and at 16 req/s), its per-token costs the chat frontend's (one set of
# tokenization / detokenization code serves both endpoints). One input at a time: fitted with every
# input sharing the CPU instead, the flood's first tokens come together late (median TTFT +23%, the
# fit's objective 0.054 against 0.040), where the measured ones spread over the run.
register_frontend("vllm-v1-api-completions", replace(FRONTENDS["vllm-v1-api"], delay_s=0.02, request_s=0.01,
                                                     input_workers=1))
# llama-server (the sim-to-real backends): a lone 16-token request's streamed first token 4.7 ms
# after the server's own prompt time (median of 8; experiments/calibrate_llamacpp.py profile).
# Its HTTP threads' CPU work is not resolved by the profile: none is modelled.
register_frontend("llamacpp-server", FrontendModel(delay_s=0.00473))
