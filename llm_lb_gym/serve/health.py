"""Whether the router sends a backend requests: health probes with hysteresis, and a circuit
breaker on the requests themselves.

Two sources, one state per backend (``BackendHealth.up``):

- **Probes.** The router asks every backend's ``/health`` each ``health_interval_s`` with a
  ``health_timeout_s`` deadline (``router_app.py``). ``health_fails`` failed probes in a row
  take an up backend out, ``health_successes`` good ones in a row bring a down one back: one
  slow answer under load does not flap it (a single failed ``/metrics`` scrape used to mark
  healthy backends down several times in a 200-stream run).
- **Requests** (the breaker). A request that fails at a backend before its first byte (a
  connection error, a 5xx, a timeout, a malformed or broken stream) counts against it;
  ``fail_threshold`` in a row (any success resets the count) take it out, and a refused or
  reset connection (the process is gone) takes it out at once. A backend taken out by its
  requests stays out at least ``open_s`` (doubling with each trip in a row, up to
  ``open_max_s``) and then needs the probes to bring it back, so a backend that answers
  ``/health`` but fails every request costs a few failed attempts per trip, not one per
  request.

Pure state, no I/O or clock of its own: the service passes the time in, the tests drive it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._validate import check_int, check_range


@dataclass(frozen=True)
class HealthConfig:
    """Probe and breaker thresholds (``RouterServiceConfig`` carries one)."""

    health_fails: int = 3
    """Failed probes in a row that take an up backend out."""
    health_successes: int = 2
    """Good probes in a row that bring a down backend back."""
    fail_threshold: int = 3
    """Failed requests in a row that take a backend out (the breaker)."""
    open_s: float = 2.0
    """Least time a backend taken out by its requests stays out; doubles per trip in a row."""
    open_max_s: float = 30.0
    """Cap of that doubling."""

    def __post_init__(self) -> None:
        check_int("health_fails", self.health_fails, 1, 100)
        check_int("health_successes", self.health_successes, 1, 100)
        check_int("fail_threshold", self.fail_threshold, 1, 1000)
        check_range("open_s", self.open_s, 0.0)
        check_range("open_max_s", self.open_max_s, self.open_s)


class BackendHealth:
    """One backend's up/down state, fed by probes and request outcomes."""

    __slots__ = ("cfg", "up", "probe_fails", "probe_oks", "req_fails", "trips", "open_until",
                 "reason")

    def __init__(self, cfg: HealthConfig):
        self.cfg = cfg
        self.up = True
        self.probe_fails = self.probe_oks = self.req_fails = self.trips = 0
        self.open_until = -math.inf
        self.reason = ""

    def on_probe(self, ok: bool, now_s: float, why: str = "") -> bool | None:
        """A probe's outcome; returns the new state if it changed (True up, False down)."""
        c = self.cfg
        if ok:
            self.probe_fails = 0
            self.probe_oks += 1
            if not self.up and self.probe_oks >= c.health_successes and now_s >= self.open_until:
                self.up, self.req_fails, self.reason = True, 0, ""
                return True
            return None
        self.probe_oks = 0
        self.probe_fails += 1
        if self.up and self.probe_fails >= c.health_fails:
            self.up = False
            self.reason = f"{self.probe_fails} health probes failed in a row ({why})"
            return False
        return None

    def on_failure(self, now_s: float, why: str, fatal: bool = False) -> bool | None:
        """A request failed at this backend before its first byte; ``fatal``: the connection was
        refused or reset (the process is gone). Returns False if this took it out."""
        self.req_fails += 1
        if not self.up or not (fatal or self.req_fails >= self.cfg.fail_threshold):
            return None
        self.trips += 1
        c = self.cfg
        self.open_until = now_s + min(c.open_max_s, c.open_s * 2 ** (self.trips - 1))
        self.up, self.probe_oks = False, 0
        self.reason = why if fatal else f"{self.req_fails} requests failed in a row (last: {why})"
        return False

    def on_success(self) -> None:
        """A request got its first byte from this backend."""
        self.req_fails = 0
        self.trips = 0
