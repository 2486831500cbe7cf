"""The corpus of real end-to-end serving measurements (``corpus.json``), read and checked.

Why: the latency presets are fitted to GPU kernel profiles, and nothing compared the simulator
with a real serving stack until issue 33. ``corpus.json`` holds published end-to-end results of
vLLM servers (benchmark duration, mean / median TTFT, median TPOT or ITL, E2E) with the setup
each was measured under (model by its config.json fields, GPU, engine version and flags,
request shapes, batch or closed-loop concurrency) and its source (URL; for a GitHub file its
repository, commit, path and git blob id). Each source is in the fitted part or the held-out
part of the corpus, a split by source fixed before any fit (``split_rule`` in the file); the
fits read ``fitted_cases`` only.

The file is part of the package; ``tests/test_validate.py`` pins its SHA-256
(:func:`corpus_digest`), so an edit is deliberate and the pinned errors are those of the bytes
the figures in docs/calibration.md came from. ``llm-lb-gym validate`` replays every case (``replay.py``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

CORPUS_PATH = Path(__file__).with_name("corpus.json")
SPLITS = ("fitted", "held_out")
WORKLOAD_KINDS = ("batch", "closed", "poisson")
ENDPOINTS = ("chat", "completions")
"""The OpenAI API endpoint a case's client called: ``/v1/chat/completions`` (the chat template
is rendered per request) or ``/v1/completions`` (the prompt as sent). The API server's
per-request work differs between them, so each has its own frontend (``serving.py``)."""
METRICS = ("duration_s", "mean_ttft_ms", "median_ttft_ms", "p95_ttft_ms", "median_tpot_ms", "median_itl_ms",
           "median_e2e_ms", "p95_e2e_ms")
"""What a case may report; ``validate`` compares every one a case has. The p95 figures are for
sources that publish tails only (``vllm bench serve --metric-percentiles 95,99``)."""


@dataclass(frozen=True)
class Workload:
    """The requests of one benchmark run: ``batch`` = all sent at once (``--request-rate inf``),
    ``closed`` = ``concurrency`` in flight, the next sent when one ends (``--max-concurrency``),
    ``poisson`` = sent at ``rate_rps`` with exponential gaps (``--request-rate R``, burstiness 1;
    ``replay.poisson_arrivals`` draws them as the client does, once per seed of ``seeds``)."""

    kind: str
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    concurrency: int | None = None
    shape_note: str = ""
    length_spread: float = 0.0
    """0: every request at ``prompt_tokens`` / ``output_tokens``. > 0: lengths drawn from a
    lognormal of this sigma (seed 0) scaled to those means, for a dataset whose per-request
    lengths are not published (ShareGPT): identical requests in a closed loop run in lockstep,
    which real ones of varied lengths do not."""
    rate_rps: float | None = None
    seeds: tuple[int, ...] = ()
    """``poisson``: the client's seeds (one run each); the measured figures are their mean and
    the simulated ones the mean over as many seeded arrival sequences."""
    resends: str = ""
    """The id of the case run just before on the same server whose prompts are this run's first
    ones, in order (the client's dataset drawn with the same seed: ``vllm bench serve``'s random
    prompt i does not depend on the count): they sit in vLLM's prefix cache when this run
    starts. The replay runs that case's closed loop first, with the same prompt hashes, and
    measures this one only (``replay.py``). Empty: fresh prompts."""
    resend_concurrency: int | None = None
    """The earlier case's concurrency (set by :func:`load_corpus` from ``resends``)."""
    resend_requests: int | None = None
    """The earlier case's number of requests (set by :func:`load_corpus`; at most this run's)."""


@dataclass(frozen=True)
class Case:
    """One measured run: its setup and the published figures (``measured``: ``METRICS`` keys)."""

    id: str
    source: str
    split: str
    engine: str
    engine_version: str
    generation: str
    model: str
    gpu: str
    tensor_parallel: int
    endpoint: str
    workload: Workload
    measured: dict[str, float]
    engine_options: dict[str, Any] = field(default_factory=dict)
    server_flags: str = ""
    client: str = ""


@dataclass(frozen=True)
class Corpus:
    cases: tuple[Case, ...]
    models: dict[str, dict]
    sources: dict[str, dict]
    split_rule: str

    def split(self, name: str) -> tuple[Case, ...]:
        return tuple(c for c in self.cases if c.split == name)

    @property
    def fitted_cases(self) -> tuple[Case, ...]:
        return self.split("fitted")

    def model_config(self, name: str) -> dict:
        """The config.json fields of a corpus model (what ``architecture.from_hf_config`` reads)."""
        return dict(self.models[name]["config"])


def corpus_digest(path: Path = CORPUS_PATH) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _case(raw: dict, sources: dict, models: dict) -> Case:
    where = f"corpus case {raw.get('id')!r}"
    src = raw["source"]
    if src not in sources:
        raise ValueError(f"{where}: source {src!r} is not among the corpus sources ({', '.join(sources)})")
    split = sources[src]["split"]
    if split not in SPLITS:
        raise ValueError(f"{where}: source {src!r} has split {split!r}; allowed: {', '.join(SPLITS)}")
    if raw["model"] not in models:
        raise ValueError(f"{where}: model {raw['model']!r} has no config.json fields in the corpus")
    w = raw["workload"]
    if w["kind"] not in WORKLOAD_KINDS:
        raise ValueError(f"{where}: workload kind {w['kind']!r}; allowed: {', '.join(WORKLOAD_KINDS)}")
    if w["kind"] == "closed" and not w.get("concurrency"):
        raise ValueError(f"{where}: a closed-loop workload needs its concurrency")
    if w["kind"] == "poisson" and not (float(w.get("rate_rps") or 0) > 0 and w.get("seeds")):
        raise ValueError(f"{where}: a poisson workload needs rate_rps > 0 and its seeds")
    if raw.get("endpoint") not in ENDPOINTS:
        raise ValueError(f"{where}: endpoint {raw.get('endpoint')!r}; allowed: {', '.join(ENDPOINTS)}")
    unknown = sorted(set(raw["measured"]) - set(METRICS) - {"request_throughput_rps"})
    if unknown:
        raise ValueError(f"{where}: unknown measured metric(s) {', '.join(unknown)}; allowed: {', '.join(METRICS)}")
    return Case(id=raw["id"], source=src, split=split, engine=raw["engine"], engine_version=raw["engine_version"],
                generation=raw["generation"], model=raw["model"], gpu=raw["gpu"],
                tensor_parallel=int(raw.get("tensor_parallel", 1)), endpoint=raw["endpoint"],
                workload=Workload(w["kind"], int(w["num_requests"]), int(w["prompt_tokens"]), int(w["output_tokens"]),
                                  w.get("concurrency"), w.get("shape_note", ""), float(w.get("length_spread", 0.0)),
                                  float(w["rate_rps"]) if w.get("rate_rps") else None,
                                  tuple(int(x) for x in w.get("seeds", ())), str(w.get("resends", ""))),
                measured={k: float(v) for k, v in raw["measured"].items() if k in METRICS},
                engine_options=dict(raw.get("engine_options", {})), server_flags=raw.get("server_flags", ""),
                client=raw.get("client", ""))


def _resolve_resend(case: Case, by_id: dict[str, Case]) -> Case:
    """``case`` with ``resend_concurrency`` and ``resend_requests`` set from the case it names in
    ``resends``, which must be a closed loop of the same source sending at most as many requests
    of the same shape."""
    w = case.workload
    prev = by_id.get(w.resends)
    where = f"corpus case {case.id!r}: workload.resends={w.resends!r}"
    if prev is None:
        raise ValueError(f"{where} is not a case id of the corpus")
    pw = prev.workload
    if (prev.source != case.source or pw.kind != "closed" or w.kind != "closed" or pw.num_requests > w.num_requests
            or (pw.prompt_tokens, pw.output_tokens) != (w.prompt_tokens, w.output_tokens)):
        raise ValueError(f"{where}: both must be closed loops of one source with requests of the same shape, the "
                         f"earlier one at most as many")
    return replace(case, workload=replace(w, resend_concurrency=int(pw.concurrency), resend_requests=pw.num_requests))


@lru_cache(maxsize=4)
def load_corpus(path: Path = CORPUS_PATH) -> Corpus:
    """The corpus, every case checked (its source, split, model and metrics named)."""
    raw = json.loads(Path(path).read_text())
    sources, models = raw["sources"], raw["models"]
    cases = tuple(_case(c, sources, models) for c in raw["cases"])
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate case ids")
    by_id = {c.id: c for c in cases}
    cases = tuple(_resolve_resend(c, by_id) if c.workload.resends else c for c in cases)
    return Corpus(cases, models, sources, raw["split_rule"])
