"""Typed options of the router service (``llm-lb-gym serve router``)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from .._validate import ConfigError, check_int, check_range


UNSERVED_ROUTERS = {
    "lookahead": "it plans over copies of the simulated cluster, which a service does not have",
    "prefix_affinity": "it reads the simulated prefix cache of each instance",
    "prefix_affinity_approx": "it needs prompt block hashes, which the service does not compute yet",
    "slo_aware": "it reads the simulated engine's token budget and iteration-time model",
}
"""Registered routers the service refuses, and why: they read simulator state that a router in
front of real servers cannot observe (``view.py`` lists what it can)."""


def served_routers() -> tuple[str, ...]:
    """The registered routers the service can run."""
    from ..routers.registry import ROUTERS

    return tuple(r for r in ROUTERS if r not in UNSERVED_ROUTERS)


_ENGINE_SETS = ("preset", "num_blocks", "block_size", "max_seqs")
"""The service's options that ``engine`` replaces (set one or the other, never both)."""

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
_NULL = ("null", "none", "~", "")


def _coerce(name: str, text: str, tp):
    """``text`` as a value of the annotation ``tp`` (float, int, bool, str, tuple of int,
    Optional of these); a ConfigError names the option, the value and what it must be."""
    import typing

    args = typing.get_args(tp)
    if type(None) in args:    # Optional[X]
        if text.strip().lower() in _NULL:
            return None
        rest = [a for a in args if a is not type(None)]
        return _coerce(name, text, rest[0] if len(rest) == 1 else str)
    t = text.strip()
    try:
        if tp is bool:
            if t.lower() in _TRUE:
                return True
            if t.lower() in _FALSE:
                return False
            raise ValueError
        if tp is int:
            v = float(t)
            if v != int(v):
                raise ValueError
            return int(v)
        if tp is float:
            return float(t)
        if typing.get_origin(tp) is tuple:
            inner = (args[0] if args else str)
            items = [x for x in t.strip("[]()").replace(" ", "").split(",") if x]
            return tuple(_coerce(name, x, inner) for x in items)
    except (TypeError, ValueError):
        kind = {bool: "true or false", int: "an integer", float: "a number"}.get(tp, f"a {tp}")
        if typing.get_origin(tp) is tuple:
            kind = "a comma-separated list (e.g. 256,2048)"
        raise ConfigError(f"{name}={text!r} is not {kind}") from None
    return text


def typed_router_options(router: str, pairs) -> dict:
    """``-o key=value`` pairs as the router's typed options (``period_s=1e9`` is a float, not
    YAML's string; ``max_wait_s=null`` is None); an unknown key or a value of the wrong kind is
    a ConfigError naming it and what is allowed. The router's own checks (ranges) come after."""
    import typing

    from ..routers.registry import ROUTER_CLASSES

    if router not in ROUTER_CLASSES:
        raise ConfigError(f"router={router!r} is unknown; allowed: {', '.join(served_routers())}")
    hints = typing.get_type_hints(ROUTER_CLASSES[router].Options)
    out = {}
    for p in pairs:
        key, sep, text = p.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"-o {p!r} is not key=value")
        if key not in hints:
            allowed = ", ".join(hints) or "none (it has no options)"
            raise ConfigError(f"-o {key}: router {router!r} has no option {key!r}; allowed: {allowed}")
        out[key] = _coerce(f"router.{router}.{key}", text, hints[key])
    return out


@dataclass(frozen=True)
class RouterServiceConfig:
    """Options of one router service process."""

    backends: tuple[str, ...]
    """Base URLs of the OpenAI-compatible backends (``http://127.0.0.1:8001``), in instance order."""
    router: str = "round_robin"
    """A name of ``llm_lb_gym.routers.ROUTERS``."""
    router_options: dict = field(default_factory=dict)
    """The router's keyword options (as in ``conf/evaluate.yaml``'s ``eval.policy_options``)."""
    models: tuple[str, ...] = ("sim-model",)
    """Model names accepted in ``model`` (an unknown one is a 404 at the router)."""
    context_tokens: int = 4096
    """Most prompt + max_tokens of a request (the served model's context window)."""
    tokenizer: str | None = None
    """Local Hugging Face tokenizer directory of the served model; None: count words."""
    preset: str = "llama2-7b-v100"
    """Latency preset for routers' ideal-latency estimates (late_binding's ``shortest`` order)."""
    decision_interval_s: float = 0.02
    """How often a holding router (one that defers) is asked again while requests wait."""
    poll_interval_s: float = 0.25
    """Period of the backends' ``/metrics`` polls (also the health check)."""
    stale_s: float = 2.0
    """Polled metrics older than this are ignored (the in-flight table alone is used)."""
    block_size: int = 16
    """KV block size assumed for backends that do not export it (llama.cpp)."""
    num_blocks: int | None = None
    """KV blocks assumed per backend that does not export them; None: what the simulator's
    hardware model gives ``preset`` at ``block_size`` (``kv_blocks``), the one place it is set."""
    max_seqs: int = 128
    """Batch slots per backend (late_binding releases only while one is free)."""
    engine: Any = None
    """The backends' engine as the simulator models it: a ``sim.config.EngineConfig`` or a
    mapping of its fields (``serve router --engine`` reads a ``conf/engine`` file). When set it
    is the one source of the views' timing (its latency model and async scheduling), of the
    routers' ideal latencies (behind its frontend) and of the KV blocks, block size and batch
    slots assumed for backends that do not export them, so ``preset``, ``num_blocks``,
    ``block_size`` and ``max_seqs`` stay at their defaults. Why: a router trained with
    ``engine=vllm_v1_h100`` (the serving fit's latency, vLLM V1's defaults, its API server's
    frontend) is served with that engine's estimates, which no latency preset names."""
    max_attempts: int = 3
    """Backends tried per request before its first byte (connection errors, 5xx, timeouts,
    broken or malformed streams are retried elsewhere; then a 502 naming the last error)."""
    retry_backoff_s: float = 0.05
    """Wait before the second attempt; doubles per attempt, capped at ``retry_backoff_max_s``."""
    retry_backoff_max_s: float = 1.0
    connect_timeout_s: float = 3.0
    """Upstream TCP connect deadline."""
    first_byte_timeout_s: float = 30.0
    """Deadline for a backend's response headers after the request is sent (servers send a
    stream's headers at once; a backend that accepts and never answers costs this, or less
    once the probes take it out). Non-streamed pass-through requests have ``request_timeout_s``."""
    idle_timeout_s: float = 120.0
    """Longest silence of an upstream stream, its first token included (a request may queue
    at a loaded backend): then it is broken (retried, or an error event once bytes went out)."""
    assemble_upstream: bool = True
    """A client's non-streamed request goes upstream as a stream and the router assembles the
    reply (``serve/assemble.py``): a client that leaves then cancels it at llama.cpp too, which
    aborts only streamed requests, and its tokens are counted as they come. False: the body is
    passed through as sent and the backend's own reply returned byte for byte."""
    queue_timeout_s: float = 60.0
    """A request waiting this long at the router (no backend up, or held) gets a 503."""
    request_timeout_s: float = 600.0
    """Whole-reply deadline of a non-streamed pass-through request (its headers come last)."""
    health_interval_s: float = 0.5
    """Period of each backend's ``/health`` probe."""
    health_timeout_s: float = 2.0
    """A probe not answered 200 within this fails."""
    health_fails: int = 3
    """Failed probes in a row that take a backend out (``health.py``)."""
    health_successes: int = 2
    """Good probes in a row that bring it back."""
    fail_threshold: int = 3
    """Failed requests in a row that take a backend out (the circuit breaker)."""
    open_s: float = 2.0
    """Least time a backend taken out by failed requests stays out (doubles per trip in a row)."""
    open_max_s: float = 30.0
    max_body_bytes: int = 8 << 20
    """Largest request body accepted (a 413 beyond)."""
    max_json_depth: int = 64
    """Deepest nesting of arrays / objects accepted in a body."""
    drain_timeout_s: float = 30.0
    """On SIGTERM: requests in flight get this long to finish, then are cancelled."""
    seed: int = 0
    """Seed of the router's generator (random, power_of_two). The simulator seeds a rollout's
    router the same way (``np.random.default_rng(seed)``), so one seed gives the served and
    the simulated random router the same draws for the same request sequence."""
    backend_header: bool = False
    """Each reply from a backend names it in an ``x-llm-lb-backend`` header (its URL as
    configured): what a load generator needs to set the served decisions beside a simulated
    router's (``sim_to_real``). Off by default: clients have no business with the backends'
    addresses."""

    def _check_engine(self) -> None:
        from ..sim.config import EngineConfig

        if isinstance(self.engine, Mapping):
            names = [f.name for f in fields(EngineConfig)]
            unknown = sorted(str(k) for k in self.engine if k not in names)
            if unknown:
                raise ConfigError(f"engine: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(names)}")
            object.__setattr__(self, "engine", EngineConfig(**dict(self.engine)))
        if not isinstance(self.engine, EngineConfig):
            raise ConfigError(f"engine={self.engine!r}; allowed: None, an EngineConfig or a mapping of its fields")
        defaults = {f.name: f.default for f in fields(type(self)) if f.name in _ENGINE_SETS}
        given = [f"{k}={getattr(self, k)!r}" for k, v in defaults.items() if getattr(self, k) != v]
        if given:
            raise ConfigError(f"engine is given, which sets the latency model, KV blocks, block size and batch "
                              f"slots; {', '.join(given)} would be ignored: drop it, or set it in the engine")

    @property
    def health(self):
        """The probe and breaker thresholds (``health.HealthConfig``)."""
        from .health import HealthConfig

        return HealthConfig(self.health_fails, self.health_successes, self.fail_threshold,
                            self.open_s, self.open_max_s)

    @property
    def kv_blocks(self) -> int:
        """``engine``'s KV blocks, ``num_blocks``, or the preset's at ``block_size`` from the
        hardware model."""
        if self.engine is not None:
            return self.engine.total_blocks
        if self.num_blocks is not None:
            return self.num_blocks
        from ..sim.config import EngineConfig

        return EngineConfig(preset=self.preset, block_size=self.block_size).total_blocks

    @property
    def latency_model(self):
        """The backends' iteration-time model: ``engine``'s, else ``preset``'s."""
        if self.engine is not None:
            return self.engine.latency_model
        from ..sim.latency import get_preset

        return get_preset(self.preset).latency

    @property
    def backend_block_size(self) -> int:
        return self.engine.block_size if self.engine is not None else self.block_size

    @property
    def backend_max_seqs(self) -> int:
        return self.engine.max_num_seqs if self.engine is not None else self.max_seqs

    @property
    def async_scheduling(self) -> bool:
        """Whether the backends overlap their CPU step with the GPU (``engine.async_scheduling``)."""
        return bool(self.engine is not None and self.engine.async_scheduling)

    @property
    def frontend_model(self):
        """The backends' API-server frontend as the simulator models it (None: none)."""
        return self.engine.frontend_model if self.engine is not None else None

    def __post_init__(self) -> None:
        if not self.backends:
            raise ConfigError("backends: give at least one backend URL (--backend http://HOST:PORT)")
        for b in self.backends:
            if not (b.startswith("http://") or b.startswith("https://")):
                raise ConfigError(f"backends: {b!r} is not an http(s) URL")
        if self.router in UNSERVED_ROUTERS:
            raise ConfigError(f"router={self.router!r} cannot run in the service: "
                              f"{UNSERVED_ROUTERS[self.router]}; allowed: {', '.join(served_routers())}")
        if self.router not in served_routers():
            raise ConfigError(f"router={self.router!r} is unknown; allowed: {', '.join(served_routers())}")
        if not self.models:
            raise ConfigError("models: give at least one model name")
        check_int("context_tokens", self.context_tokens, 2)
        check_range("decision_interval_s", self.decision_interval_s, 0.001, 60.0)
        check_range("poll_interval_s", self.poll_interval_s, 0.01, 600.0)
        check_range("stale_s", self.stale_s, 0.0, lo_open=True, allow_inf=True)
        check_int("block_size", self.block_size, 1)
        if self.num_blocks is not None:
            check_int("num_blocks", self.num_blocks, 1)
        check_int("max_seqs", self.max_seqs, 1)
        if self.engine is not None:
            self._check_engine()
        check_int("max_attempts", self.max_attempts, 1, 100)
        for name in ("assemble_upstream", "backend_header"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r}: allowed: True, False")
        for name in ("retry_backoff_s", "retry_backoff_max_s"):
            check_range(name, getattr(self, name), 0.0, 60.0)
        for name in ("connect_timeout_s", "first_byte_timeout_s", "idle_timeout_s", "queue_timeout_s",
                     "request_timeout_s", "health_timeout_s", "drain_timeout_s"):
            check_range(name, getattr(self, name), 0.0, 86400.0, lo_open=True)
        check_range("health_interval_s", self.health_interval_s, 0.01, 600.0)
        check_int("max_body_bytes", self.max_body_bytes, 1024)
        check_int("max_json_depth", self.max_json_depth, 4, 10000)
        check_int("seed", self.seed, 0)
        self.health   # the probe and breaker thresholds' own checks
