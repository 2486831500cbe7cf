"""Non-streamed requests sent upstream as streams, the reply assembled at the router
(``assemble_upstream``, serve/assemble.py): equal to the backend's own reply, cancelled as a
stream when the client leaves, tokens counted as they come, faults retried or a clear 502.

Real sockets on 127.0.0.1, ephemeral ports, every wait bounded. ``Spy`` is a scripted backend
that records what the router sent and whether a stream was abandoned."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("aiohttp")
httpx = pytest.importorskip("httpx")

from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from llm_lb_gym.serve.assemble import Assembler  # noqa: E402
from llm_lb_gym.serve.launch import ServerThread  # noqa: E402
from llm_lb_gym.serve.protocol import CHAT, COMPLETIONS  # noqa: E402
from llm_lb_gym.serve.sim_backend import SimBackendConfig  # noqa: E402
from llm_lb_gym.serve.sim_backend import create_app as sim_app  # noqa: E402
from test_serve import MODEL, _leave_after, metric, start_router, wait_for  # noqa: E402


class Spy:
    """A completions backend that streams ``tokens`` words ``gap_s`` apart. ``mode``: ``ok``;
    ``break`` (the connection drops after two tokens); ``truncate`` (the stream ends cleanly
    after two tokens, no finish reason, no [DONE]); ``error`` (an SSE error event after one);
    ``late_break`` (the connection drops after [DONE])."""

    def __init__(self, mode: str = "ok", tokens: int = 5, gap_s: float = 0.0):
        self.mode, self.tokens, self.gap_s = mode, tokens, gap_s
        self.bodies: list[dict] = []
        self.abandoned = 0

        async def completions(request: Request):
            body = json.loads(await request.body())
            self.bodies.append(body)
            return StreamingResponse(self._stream(), media_type="text/event-stream")

        async def metrics(request: Request):
            return PlainTextResponse("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

        self.app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                                     Route("/metrics", metrics)])

    @staticmethod
    def _event(obj) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    async def _stream(self):
        finished = False
        try:
            for i in range(self.tokens):
                if i == 2 and self.mode in ("break", "truncate"):
                    if self.mode == "break":
                        raise RuntimeError("spy: connection dropped mid-stream")
                    finished = True
                    return
                if i == 1 and self.mode == "error":
                    yield self._event({"error": {"message": "spy: out of memory", "code": 500}})
                    finished = True
                    return
                yield self._event({"id": "cmpl-spy", "object": "text_completion", "created": 7,
                                   "model": MODEL, "choices": [{"index": 0, "text": f"w{i} ",
                                                                "finish_reason": None}]})
                await asyncio.sleep(self.gap_s)
            yield self._event({"id": "cmpl-spy", "object": "text_completion", "created": 7, "model": MODEL,
                               "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
            yield self._event({"id": "cmpl-spy", "object": "text_completion", "created": 7, "model": MODEL,
                               "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": self.tokens,
                                                        "total_tokens": 1 + self.tokens}})
            yield b"data: [DONE]\n\n"
            if self.mode == "late_break":
                raise RuntimeError("spy: connection dropped after [DONE]")
            finished = True
        finally:
            if not finished and self.mode not in ("break", "late_break"):
                self.abandoned += 1


def _post(url: str, body: dict, path: str = "/v1/completions"):
    return httpx.post(url + path, json=body, timeout=20)


@pytest.mark.parametrize("kind", [COMPLETIONS, CHAT])
def test_assembled_reply_equals_the_backend_s_own(kind):
    path = "/v1/completions" if kind == COMPLETIONS else "/v1/chat/completions"
    body = ({"model": MODEL, "prompt": "a b c", "max_tokens": 7} if kind == COMPLETIONS else
            {"model": MODEL, "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 7})
    with ServerThread(sim_app(SimBackendConfig(time_scale=4.0))) as b, start_router([b.url]) as r, \
            start_router([b.url], assemble_upstream=False) as plain:
        own = _post(b.url, body, path).json()
        got = _post(r.url, body, path).json()
        passed = _post(plain.url, body, path).json()
    assert got["object"] == own["object"] and got["model"] == own["model"]
    assert got["usage"] == own["usage"] == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}
    key = "text" if kind == COMPLETIONS else "message"
    assert [c[key] for c in got["choices"]] == [c[key] for c in own["choices"]]
    assert [c["finish_reason"] for c in got["choices"]] == ["length"]
    assert got["id"].startswith("cmpl-sim-") and isinstance(got["created"], int)
    assert set(passed) == set(own) and passed["usage"] == own["usage"]   # off: the backend's own


def test_router_asks_for_a_stream_and_counts_tokens_as_they_come():
    spy = Spy(tokens=20, gap_s=0.05)
    with ServerThread(spy.app) as b, start_router([b.url]) as r:
        svc = r.server.config.app.state.service
        seen = []

        async def go():
            import aiohttp

            async with aiohttp.ClientSession() as client:
                task = asyncio.ensure_future(client.post(r.url + "/v1/completions", json={
                    "model": MODEL, "prompt": "x", "max_tokens": 20}))
                for _ in range(100):
                    await asyncio.sleep(0.02)
                    seen.extend(int(svc.table.o_base[rid]) for rid in svc.views[0].inflight)
                    if task.done():
                        break
                resp = await task
                return resp.status, await resp.json()

        status, reply = asyncio.run(go())
    assert status == 200
    assert reply["choices"][0]["text"] == "".join(f"w{i} " for i in range(20))
    assert reply["choices"][0]["finish_reason"] == "stop" and reply["usage"]["completion_tokens"] == 20
    assert spy.bodies[0]["stream"] is True and spy.bodies[0]["stream_options"] == {"include_usage": True}
    assert any(0 < n < 20 for n in seen) and max(seen) <= 20, seen   # counted as they came


def test_a_non_streamed_client_that_leaves_cancels_the_upstream_stream():
    spy = Spy(tokens=200, gap_s=0.02)     # ~4 s of tokens; the client leaves after 0.3 s
    with ServerThread(spy.app) as b, start_router([b.url]) as r:
        svc = r.server.config.app.state.service
        t0 = time.monotonic()
        _leave_after(r.url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 200}, 0.3)
        wait_for(lambda: spy.abandoned == 1, timeout_s=3.0, what="the backend to see its stream closed")
        assert time.monotonic() - t0 < 2.0
        wait_for(lambda: not svc.views[0].inflight, what="the router's in-flight table to empty")
        text = httpx.get(r.url + "/metrics").text
        assert metric(text, "llm_lb_router_requests_total", outcome="cancelled") == 1
        assert spy.bodies[0]["stream"] is True


def test_a_stream_broken_before_the_reply_is_complete_is_retried_elsewhere():
    for mode in ("break", "truncate"):
        bad, good = Spy(mode), Spy("ok")
        with ServerThread(bad.app) as b1, ServerThread(good.app) as b2, \
                start_router([b1.url, b2.url], router="round_robin") as r:
            resp = _post(r.url, {"model": MODEL, "prompt": "x", "max_tokens": 5})
            assert resp.status_code == 200, (mode, resp.text)
            assert resp.json()["choices"][0]["text"] == "w0 w1 w2 w3 w4 "
            assert len(bad.bodies) == 1 and len(good.bodies) == 1
            text = httpx.get(r.url + "/metrics").text
            assert metric(text, "llm_lb_router_failovers_total", backend=b1.url) == 1
            assert metric(text, "llm_lb_router_requests_total", outcome="ok") == 1
            svc = r.server.config.app.state.service
            assert all(not v.inflight for v in svc.views)


def test_a_connection_dropped_after_done_keeps_the_whole_reply():
    spy = Spy("late_break")
    with ServerThread(spy.app) as b, start_router([b.url]) as r:
        resp = _post(r.url, {"model": MODEL, "prompt": "x", "max_tokens": 5})
        assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "w0 w1 w2 w3 w4 "
        assert len(spy.bodies) == 1


def test_every_stream_broken_is_a_502_and_an_error_event_is_passed_on():
    spies = [Spy("break"), Spy("break")]
    with ServerThread(spies[0].app) as b1, ServerThread(spies[1].app) as b2, \
            start_router([b1.url, b2.url], max_attempts=2, queue_timeout_s=2.0) as r:
        t0 = time.monotonic()
        resp = _post(r.url, {"model": MODEL, "prompt": "x", "max_tokens": 5})
        assert resp.status_code == 502, resp.text
        assert time.monotonic() - t0 < 10
        assert "every attempt failed (2)" in resp.json()["error"]["message"]
    spy = Spy("error")
    with ServerThread(spy.app) as b, start_router([b.url]) as r:
        resp = _post(r.url, {"model": MODEL, "prompt": "x", "max_tokens": 5})
        assert resp.status_code == 502 and "spy: out of memory" in resp.json()["error"]["message"]
        assert len(spy.bodies) == 1   # the backend's own error is not retried
        assert metric(httpx.get(r.url + "/metrics").text, "llm_lb_router_requests_total",
                      outcome="upstream_error") == 1


def test_requests_the_assembler_cannot_rebuild_are_passed_through():
    spy = Spy("ok")
    with ServerThread(spy.app) as b, start_router([b.url]) as r:
        for extra in ({"logprobs": 2}, {"best_of": 2}, {"logprobs": None, "tools": []}):
            resp = _post(r.url, {"model": MODEL, "prompt": "x", "max_tokens": 5, **extra})
            assert resp.status_code == 200   # the spy streams anyway; the router passed it as sent
    assert ["stream" in b for b in spy.bodies] == [False, False, True]   # the last is assembled
    assert "stream_options" not in spy.bodies[0]


def test_assembler_joins_split_chunks_and_falls_back_to_its_own_counts():
    asm = Assembler(CHAT)
    events = (b'data: {"id":"c1","created":3,"model":"m","choices":[{"index":0,"delta":{"role":"assistant",'
              b'"content":null}}]}\n\ndata: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\r\n\r\n'
              b'data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}\n\n')
    counted = sum(asm.feed(events[i:i + 7]) for i in range(0, len(events), 7))
    assert counted == 2 and asm.complete and not asm.done
    reply = asm.reply(prompt_tokens=4)
    assert reply["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                                 "finish_reason": "stop"}]
    assert reply["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    assert (reply["id"], reply["created"], reply["object"]) == ("c1", 3, "chat.completion")
    assert "timings" not in reply   # none sent, none made up
    asm = Assembler("completions")   # llama.cpp's final event carries its own timings: kept
    asm.feed(b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
             b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}],'
             b'"timings":{"prompt_n":4,"prompt_ms":12.5,"predicted_ms":3.0}}\n\ndata: [DONE]\n\n')
    assert asm.reply(prompt_tokens=4)["timings"] == {"prompt_n": 4, "prompt_ms": 12.5, "predicted_ms": 3.0}


def test_assemble_upstream_must_be_a_bool():
    from llm_lb_gym._validate import ConfigError
    from llm_lb_gym.serve.config import RouterServiceConfig

    with pytest.raises(ConfigError, match="assemble_upstream.*allowed: True, False"):
        RouterServiceConfig(backends=("http://127.0.0.1:1",), assemble_upstream="yes")
