"""The router service against bad backends and bad clients, over real sockets on 127.0.0.1:
a backend that accepts and never answers, one that answers 500, one whose stream is not SSE,
clients that leave at every stage, bad input, probes with hysteresis, the circuit breaker,
SIGTERM (llm_lb_gym/serve/upstream.py, service.py, health.py; docs/serving.md, Faults)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from llm_lb_gym.serve.config import RouterServiceConfig  # noqa: E402
from llm_lb_gym.serve.health import BackendHealth, HealthConfig  # noqa: E402
from llm_lb_gym.serve.launch import ServerThread, free_port, wait_healthy  # noqa: E402
from llm_lb_gym.serve.router_app import create_app as router_app  # noqa: E402
from llm_lb_gym.serve.sim_backend import SimBackendConfig  # noqa: E402
from llm_lb_gym.serve.sim_backend import create_app as sim_app  # noqa: E402

MODEL = "sim-model"
BODY = {"model": MODEL, "prompt": "a b c", "max_tokens": 3}
FAST_HEALTH = dict(poll_interval_s=0.05, health_interval_s=0.1, health_timeout_s=0.3)


def metric(text: str, name: str, **labels) -> float:
    import re

    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([\w:]+)(\{[^}]*\})?\s+(\S+)$", line)
        if m and m.group(1) == name:
            lab = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(lab.get(k) == v for k, v in labels.items()):
                total += float(m.group(3))
    return total


def wait_for(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Hung:
    """A port that accepts connections (the kernel's backlog) and never answers: a hung server."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def stop(self):
        self.sock.close()


def scripted(post):
    """An ASGI backend: /health and /metrics answer, POSTs go to ``post(send)``."""
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["method"] == "GET":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}" if scope["path"] == "/health" else b""})
            return
        while (await receive()).get("more_body"):
            pass
        app.posts += 1
        await post(send)

    app.posts = 0
    return app


async def answer_500(send):
    await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"error": {"message": "engine dead"}}'})


def token_event(text=" tok", finish=None) -> bytes:
    obj = {"id": "x", "object": "text_completion", "model": MODEL,
           "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def garbage_after_a_token(send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": token_event(), "more_body": True})
    await asyncio.sleep(0.05)
    await send({"type": "http.response.body", "body": b"<html>502 Bad Gateway</html>\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def good():
    s = ServerThread(sim_app(SimBackendConfig(time_scale=4.0)))
    yield s
    s.stop()


def test_a_hung_backend_fails_over_within_seconds(good):
    """Requests routed to a backend that accepts and never answers complete elsewhere once the
    probes take it out (3 failed probes of 0.3 s), not after the 30 s header deadline."""
    hung = Hung()
    try:
        cfg = RouterServiceConfig(backends=(hung.url, good.url), router="round_robin", **FAST_HEALTH)
        with ServerThread(router_app(cfg)) as r:
            async def go():
                async with __import__("aiohttp").ClientSession() as c:
                    async def one(stream):
                        t = time.monotonic()
                        async with c.post(r.url + "/v1/completions", json={**BODY, "stream": stream}) as resp:
                            text = await resp.text()
                        return resp.status, text, time.monotonic() - t
                    return await asyncio.gather(*(one(k % 2 == 1) for k in range(6)))
            results = asyncio.run(go())
            assert all(s == 200 for s, _, _ in results), results
            assert all("[DONE]" in t or '"usage"' in t for _, t, _ in results)
            assert max(dt for _, _, dt in results) < 10.0
            text = httpx.get(r.url + "/metrics").text
            assert metric(text, "llm_lb_router_backend_up", backend=hung.url) == 0.0
            assert metric(text, "llm_lb_router_failovers_total", backend=hung.url) >= 1
            h = httpx.get(r.url + "/health").json()
            assert h["up"] == [good.url] and "health probes failed" in h["down"][hung.url]
    finally:
        hung.stop()


def test_a_lone_hung_backend_is_a_clear_error_within_seconds():
    """Nothing else to fail over to: once the probes take it out the client gets a 502 naming
    it, not a wait for the queue timeout (60 s)."""
    hung = Hung()
    try:
        with ServerThread(router_app(RouterServiceConfig(backends=(hung.url,), **FAST_HEALTH))) as r:
            t = time.monotonic()
            resp = httpx.post(r.url + "/v1/completions", json=BODY, timeout=30)
            assert resp.status_code == 502 and time.monotonic() - t < 10.0
            msg = resp.json()["error"]["message"]
            assert "every backend is down" in msg and hung.url in msg
    finally:
        hung.stop()


def test_no_response_headers_is_a_timeout_then_a_failover(good):
    """With the probes slow (2 s x 3), the 0.5 s header deadline fails the attempt over."""
    hung = Hung()
    try:
        cfg = RouterServiceConfig(backends=(hung.url, good.url), router="round_robin", first_byte_timeout_s=0.5)
        with ServerThread(router_app(cfg)) as r:
            t = time.monotonic()
            resp = httpx.post(r.url + "/v1/completions", json=BODY, timeout=20)   # round robin: the hung one first
            assert resp.status_code == 200 and time.monotonic() - t < 3.0
            text = httpx.get(r.url + "/metrics").text
            assert metric(text, "llm_lb_router_upstream_failures_total", backend=hung.url, stage="connect") == 1
    finally:
        hung.stop()


def test_500s_are_retried_and_trip_the_breaker(good):
    bad = ServerThread(scripted(answer_500))
    try:
        cfg = RouterServiceConfig(backends=(bad.url, good.url), router="jsq", fail_threshold=3, open_s=30.0,
                                  **FAST_HEALTH)
        with ServerThread(router_app(cfg)) as r:
            with httpx.Client(base_url=r.url, timeout=20) as c:
                for _ in range(10):    # jsq prefers the idle 500-backend until the breaker opens
                    assert c.post("/v1/completions", json=BODY).status_code == 200
            text = httpx.get(r.url + "/metrics").text
            assert metric(text, "llm_lb_router_backend_down_total", backend=bad.url) == 1
            assert bad.server.config.app.posts == 3     # then it is out (open 30 s: probes cannot close it)
            assert metric(text, "llm_lb_router_requests_total", outcome="ok") == 10
        # every backend answering 500: a 502 naming the last error after max_attempts
        cfg = RouterServiceConfig(backends=(bad.url,), max_attempts=2, retry_backoff_s=0.01, **FAST_HEALTH)
        with ServerThread(router_app(cfg)) as r:
            resp = httpx.post(r.url + "/v1/completions", json=BODY, timeout=20)
            assert resp.status_code == 502
            assert "every attempt failed (2)" in resp.json()["error"]["message"] and "answered 500" in resp.text
    finally:
        bad.stop()


def test_a_malformed_stream_ends_with_an_error_event_counted_as_an_error(good):
    bad = ServerThread(scripted(garbage_after_a_token))
    try:
        cfg = RouterServiceConfig(backends=(bad.url,), **FAST_HEALTH)
        with ServerThread(router_app(cfg)) as r:
            with httpx.stream("POST", r.url + "/v1/completions", json={**BODY, "stream": True}, timeout=20) as resp:
                lines = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
            assert '" tok"' in lines[0]
            err = json.loads(lines[-1][6:])["error"]
            assert err["code"] == "upstream_error" and "malformed" in err["message"]
            text = httpx.get(r.url + "/metrics").text
            assert metric(text, "llm_lb_router_requests_total", outcome="upstream_error") == 1
            assert metric(text, "llm_lb_router_requests_total", outcome="ok") == 0
        # non-streamed: assembled, so nothing went out yet: retried on the good backend
        cfg = RouterServiceConfig(backends=(bad.url, good.url), router="round_robin", **FAST_HEALTH)
        with ServerThread(router_app(cfg)) as r:
            resp = httpx.post(r.url + "/v1/completions", json=BODY, timeout=20)
            assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3
    finally:
        bad.stop()


def test_a_client_leaving_before_the_backend_s_headers_is_cancelled():
    """The issue: a stream whose client left before headers came stayed in flight for 14+ min."""
    hung = Hung()
    try:
        with ServerThread(router_app(RouterServiceConfig(backends=(hung.url,)))) as r:
            for stream in (True, False):
                with pytest.raises(httpx.ReadTimeout):
                    httpx.post(r.url + "/v1/completions", json={**BODY, "stream": stream}, timeout=0.4)
            svc = r.server.config.app.state.service
            wait_for(lambda: not svc.views[0].inflight and not svc.table.live, 3.0, "the requests to leave")
            text = httpx.get(r.url + "/metrics").text
            assert metric(text, "llm_lb_router_requests_total", outcome="cancelled") == 2
    finally:
        hung.stop()


def test_bad_input_is_never_a_500_and_always_openai_shaped(good):
    cfg = RouterServiceConfig(backends=(good.url,), context_tokens=200, max_body_bytes=300_000)
    with ServerThread(router_app(cfg)) as r:
        chat = r.url + "/v1/chat/completions"
        cases = [
            ("POST", chat, b"[" * 100000 + b"]" * 100000, 400, "nests deeper"),
            ("POST", chat, json.dumps({"model": MODEL, "messages": [{"role": "user", "content": [
                {"type": "text", "text": 5}]}]}).encode(), 400, "text must be a string"),
            ("POST", chat, json.dumps({"model": MODEL, "messages": [{"role": "user", "content": [
                {"type": "text", "text": None}]}]}).encode(), 400, "text must be a string"),
            ("POST", chat, json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                       "temperature": "hot"}).encode(), 400, "'temperature' must be a number"),
            ("POST", chat, b"x" * 300_001, 413, "larger than 300000 bytes"),
            ("GET", chat, b"", 405, "not allowed"),
            ("POST", r.url + "/v1/nowhere", b"{}", 404, "no such endpoint"),
            ("DELETE", r.url + "/health", b"", 405, "allowed: GET"),
        ]
        for method, url, raw, status, why in cases:
            resp = httpx.request(method, url, content=raw, timeout=10)
            assert resp.status_code == status, (why, resp.text)
            err = resp.json()["error"]
            assert why in err["message"] and {"message", "type", "param", "code"} <= set(err)
        # a good request still works afterwards
        assert httpx.post(chat, json={"model": MODEL, "messages": [{"role": "user", "content": None}]},
                          timeout=10).status_code == 200


def test_probes_have_hysteresis_and_the_breaker_backs_off():
    h = BackendHealth(HealthConfig(health_fails=3, health_successes=2, fail_threshold=3, open_s=1.0, open_max_s=4.0))
    assert h.on_probe(False, 0.0) is None and h.on_probe(False, 0.1) is None and h.on_probe(True, 0.2) is None
    assert h.up                                     # two slow probes under load: still up
    assert [h.on_probe(False, t) for t in (0.3, 0.4, 0.5)] == [None, None, False]
    assert h.on_probe(True, 0.6) is None and h.on_probe(True, 0.7) is True
    # breaker: 3 failures in a row take it out for open_s, doubling per trip in a row
    for k, opened in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 4.0)):
        t0 = 10.0 * k
        assert [h.on_failure(t0, "500") for _ in range(3)] == [None, None, False]
        assert h.open_until == t0 + opened
        assert h.on_probe(True, t0 + 0.1) is None and h.on_probe(True, t0 + 0.2) is None   # still open
        assert h.on_probe(True, t0 + opened) is True
    h.on_success()
    assert h.trips == 0
    assert h.on_failure(100.0, "refused", fatal=True) is False    # a refused connection: out at once


def test_sigterm_drains_within_the_bound(tmp_path):
    """A stream in flight finishes during the drain; one longer than the bound is cancelled at it,
    and the router exits."""
    bport, rport = free_port(), free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    backend = subprocess.Popen([sys.executable, "-m", "llm_lb_gym.experiments.serve", "sim", "--port", str(bport)],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    router = None
    try:
        wait_healthy(f"http://127.0.0.1:{bport}", 60, backend)
        router = subprocess.Popen([sys.executable, "-m", "llm_lb_gym.experiments.serve", "router", "--port", str(rport),
                                   "--backend", f"http://127.0.0.1:{bport}", "--drain-timeout-s", "2"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{rport}"
        wait_healthy(url, 60, router)
        got = {}

        def stream(name, tokens):
            try:
                with httpx.stream("POST", url + "/v1/completions", timeout=30,
                                  json={**BODY, "max_tokens": tokens, "stream": True}) as resp:
                    got[name] = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
            except httpx.HTTPError as exc:
                got[name] = exc

        threads = [threading.Thread(target=stream, args=("short", 40)),    # ~0.7 s on a V100
                   threading.Thread(target=stream, args=("long", 2000))]   # ~40 s
        for t in threads:
            t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        router.send_signal(signal.SIGTERM)
        router.wait(timeout=15)
        assert time.monotonic() - t0 < 6.0
        for t in threads:
            t.join(10)
        assert got["short"][-1] == "data: [DONE]"
        assert not isinstance(got["long"], list) or got["long"][-1] != "data: [DONE]"
    finally:
        for p in (router, backend):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
