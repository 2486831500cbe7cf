"""Typed options of the router service (``llm-lb-gym serve router``)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    max_attempts: int = 3
    """Backends tried per request when connecting or a non-streamed reply fails."""
    assemble_upstream: bool = True
    """A client's non-streamed request goes upstream as a stream and the router assembles the
    reply (``serve/assemble.py``): a client that leaves then cancels it at llama.cpp too, which
    aborts only streamed requests, and its tokens are counted as they come. False: the body is
    passed through as sent and the backend's own reply returned byte for byte."""
    queue_timeout_s: float = 60.0
    """A request waiting this long at the router (no backend up, or held) gets a 503."""
    request_timeout_s: float = 600.0
    """Upstream read timeout."""
    seed: int = 0
    """Seed of the router's generator (random, power_of_two)."""

    @property
    def kv_blocks(self) -> int:
        """``num_blocks``, or the preset's KV blocks at ``block_size`` from the hardware model."""
        if self.num_blocks is not None:
            return self.num_blocks
        from ..sim.config import EngineConfig

        return EngineConfig(preset=self.preset, block_size=self.block_size).total_blocks

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
        check_int("max_attempts", self.max_attempts, 1, 100)
        if not isinstance(self.assemble_upstream, bool):
            raise ConfigError(f"assemble_upstream={self.assemble_upstream!r}: allowed: True, False")
        check_range("queue_timeout_s", self.queue_timeout_s, 0.0, lo_open=True)
        check_range("request_timeout_s", self.request_timeout_s, 0.0, lo_open=True)
        check_int("seed", self.seed, 0)
