"""One client request through the router: a backend, its reply, and every way that can fail.

Stages, each bounded, each retried elsewhere while nothing has gone to the client:

1. **At the router** (``service.acquire``): held by a holding router or waiting for a backend;
   ``queue_timeout_s``, then a 503.
2. **Connect and headers**: ``connect_timeout_s``, then ``first_byte_timeout_s`` for the
   response headers of a streamed upstream request (servers send them at once); a non-streamed
   pass-through reply (its headers come with its end) has ``request_timeout_s``.
3. **First token** (streamed upstream requests): the router reads the backend's first chunk
   before it answers the client, so a backend that fails before its first token (killed, hung,
   a malformed first event) costs a retry, not an error. Upstream silences are bounded by
   ``idle_timeout_s`` (``http_client.py``, each wait for data), queueing at the backend included.
4. **Relay** (streamed) or **assembly** (non-streamed, ``assemble.py``): every chunk is checked
   (``sse.py``) and its text events counted into the in-flight table. An assembled reply is
   retried whole on any fault (nothing went out yet); a relayed stream that breaks, stalls, turns
   malformed or stops before its finish ends with an SSE ``error`` event, counted as
   ``upstream_error`` (it cannot be replayed: bytes went out).

Retries: connection errors, 5xx, timeouts and bad streams before the first byte, up to
``max_attempts`` attempts with a backoff of ``retry_backoff_s`` doubling to
``retry_backoff_max_s``, each on a backend it has not failed at where one is up; every failure
feeds the backend's circuit breaker (``health.py``). A 4xx from a backend is the client's and is
passed through; the backend's own SSE error event in an assembled reply is a 502 with its
message.

Cancellation has one mechanism (``Guard``): the request's own task is cancelled with a reason,
by its client leaving (watched from the first byte read to the last byte written: held at the
router, waiting for headers, streaming), by its backend being taken out (``service.mark_down``)
or by a stage's deadline; the reason says whether to retry, answer or stop. A client that
leaves closes the upstream connection, which is how vLLM, llama.cpp (for streams) and the
simulated backend learn to abort.
"""

from __future__ import annotations

import asyncio
import time

from .assemble import Assembler, UpstreamErrorEvent, needs_passthrough, streamed_body
from .protocol import BadRequest, dumps, error_body, parse_request
from .http_client import ConnectFailed
from .service import UPSTREAM_ERRORS, NoBackend, RouterService
from .sse import MalformedStream, StreamCheck

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
BACKEND_HEADER = b"x-llm-lb-backend"
"""Names the backend that answered (``RouterServiceConfig.backend_header``)."""


class Guard:
    """Why a request's own task was cancelled: ``client`` (it left), ``backend_down`` (its
    backend was taken out before the first byte), ``timeout`` (a stage's deadline)."""

    __slots__ = ("task", "why", "timer", "live", "late")

    def __init__(self):
        self.task = asyncio.current_task()
        self.why: str | None = None
        self.timer = None
        self.live = True
        self.late = ""        # what the deadline set last bounds

    def trip(self, why: str) -> None:
        if self.live and self.why is None:
            self.why = why
            self.task.cancel()

    def deadline(self, seconds: float, what: str) -> None:
        self.late = f"{what} within {seconds} s"
        self.timer = asyncio.get_running_loop().call_later(seconds, self.trip, "timeout")

    def clear(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def caught(self, *reasons: str) -> str | None:
        """After a CancelledError: its reason if among ``reasons`` (the task is then uncancelled
        and the request goes on), else None (re-raise: the client left, or shutdown)."""
        why = self.why
        if why not in reasons:
            return None
        self.why = None
        if hasattr(self.task, "uncancel"):
            self.task.uncancel()
        return why


class Failed(Exception):
    """An attempt failed before the first byte reached the client: retry elsewhere."""

    def __init__(self, stage: str, why: str, fatal: bool = False):
        super().__init__(why)
        self.stage, self.fatal = stage, fatal


class Relay:
    """A reply being read from a backend; ``cut`` closes it (a probe took the backend out)."""

    __slots__ = ("resp", "last", "why")

    def __init__(self, resp):
        self.resp, self.last, self.why = resp, time.monotonic(), None

    def cut(self, why: str) -> None:
        self.why = why
        self.resp.close()


async def send_json(send, status: int, obj, headers=()) -> None:
    body = dumps(obj)
    await send({"type": "http.response.start", "status": status,
                "headers": JSON_HEADERS + [(b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive, limit: int) -> bytes | None:
    """The request body, or None once it exceeds ``limit`` bytes (the rest is not read)."""
    msg = await receive()
    body = msg.get("body", b"")
    if not msg.get("more_body"):
        return body if len(body) <= limit else None
    parts, n = [body], len(body)
    while msg.get("more_body"):
        msg = await receive()
        if msg["type"] != "http.request":
            break
        chunk = msg.get("body", b"")
        n += len(chunk)
        if n > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


async def _client_gone(receive) -> None:
    """Return when the server reports the client's disconnect (after the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _authorization(scope) -> str | None:
    """The client's Authorization header, passed upstream (the only header that is)."""
    for k, v in scope["headers"]:
        if k == b"authorization":
            return v.decode("latin-1")
    return None


class Proxy:
    """The OpenAI endpoints' handler (``router_app.py`` routes to it)."""

    def __init__(self, svc: RouterService):
        self.svc = svc
        self.named = svc.cfg.backend_header

    def via(self, view) -> list:
        """The reply's header naming its backend (``backend_header``), or none."""
        return [(BACKEND_HEADER, view.url.encode("latin-1"))] if self.named else []

    async def handle(self, scope, receive, send, kind: str, path: str) -> None:
        svc, cfg = self.svc, self.svc.cfg
        raw = await read_body(receive, cfg.max_body_bytes)
        try:
            if raw is None:
                raise BadRequest(413, f"request body larger than {cfg.max_body_bytes} bytes",
                                 None, "request_too_large")
            req = parse_request(raw, kind, cfg.models, cfg.context_tokens, svc.count, cfg.max_json_depth)
        except BadRequest as exc:
            svc.count_outcome(kind, "rejected")
            await send_json(send, exc.status, exc.body())
            return
        tb = svc.table
        pb, db = (0, 0) if svc.buckets is None else svc.buckets(req.prompt_tokens, req.max_tokens)
        rid = tb.add(req.prompt_tokens, float(req.max_tokens), svc.now_s(),
                     svc.inv_ideal(req.prompt_tokens, req.max_tokens), pb, db)
        guard = Guard()
        gone = asyncio.ensure_future(_client_gone(receive))
        gone.add_done_callback(lambda f: f.cancelled() or guard.trip("client"))
        try:
            outcome = await self._serve(req, raw, _authorization(scope), kind, path, rid, guard, send)
        except asyncio.CancelledError:
            if guard.caught("client") is None:
                raise    # cancelled from outside (shutdown)
            outcome = "cancelled"
        finally:
            guard.live = False
            guard.clear()
            gone.cancel()
            tb.free(rid)
        svc.count_outcome(kind, outcome)

    async def _serve(self, req, raw, auth, kind, path, rid, guard, send) -> str:
        """Attempts until one answers the client; returns the outcome counted."""
        svc, cfg = self.svc, self.svc.cfg
        assemble = not req.stream and cfg.assemble_upstream and needs_passthrough(req.body) is None
        body = streamed_body(req.body) if assemble else raw
        avoid, last = [], ""
        for attempt in range(cfg.max_attempts):
            if attempt:
                if not any(v.up for v in svc.views):
                    # Failed once and nothing is up: answer now rather than hold the client for
                    # the queue timeout (a first attempt does wait, riding over a restart).
                    await send_json(send, 502, error_body(f"every backend is down after {attempt} failed "
                                                          f"attempt(s); last: {last}", "upstream_error"))
                    return "upstream_error"
                await asyncio.sleep(min(cfg.retry_backoff_max_s, cfg.retry_backoff_s * 2 ** (attempt - 1)))
            try:
                view = await svc.acquire(rid, retry=attempt > 0, avoid=avoid)
            except NoBackend:
                why = "no backend is up" if not svc.cluster.engines else "the router held it"
                await send_json(send, 503, error_body(f"no backend took the request within "
                                                      f"{cfg.queue_timeout_s} s ({why})", "no_backend"))
                return "no_backend"
            try:
                return await self._attempt(view, req, body, auth, kind, path, rid, guard, send, assemble)
            except Failed as f:
                last = f"{view.url}: {f}"
                avoid.append(view)
                svc.m_failover.labels(view.url).inc()
                svc.attempt_failed(view, f.stage, str(f), f.fatal)
                svc.table.o_base[rid] = 0
        await send_json(send, 502, error_body(f"every attempt failed ({cfg.max_attempts}); last: {last}",
                                              "upstream_error"))
        return "upstream_error"

    async def _attempt(self, view, req, body, auth, kind, path, rid, guard, send, assemble) -> str:
        """One backend's try; raises ``Failed`` while nothing went to the client."""
        svc, cfg = self.svc, self.svc.cfg
        streamed_up = req.stream or assemble
        resp, relay, stage = None, None, "connect"
        view.guards[rid] = guard
        try:
            try:
                if streamed_up:
                    guard.deadline(cfg.first_byte_timeout_s, "no response headers")
                else:
                    guard.deadline(cfg.request_timeout_s, "no whole reply")
                resp = await svc.pool.request(view.addr, view.base_path + path, body, cfg.idle_timeout_s, auth)
                stage = "headers"
                if resp.status >= 500:
                    text = (await resp.read(300))[:300].decode("utf-8", "replace")
                    raise Failed("status", f"answered {resp.status}: {text}")
                if resp.status != 200 or not streamed_up:   # a 4xx (the client's) or a whole reply
                    content = await resp.read()
                    guard.clear()
                    svc.attempt_ok(view)
                    await self._answer(send, resp.status, content, resp.content_type(), self.via(view))
                    return "ok" if resp.status == 200 else "backend_status"
                guard.clear()
                stage = "first_token"
                relay = view.relays[rid] = Relay(resp)
                if assemble:
                    return await self._assembled(view, resp, relay, kind, rid, req, guard, send)
                check = StreamCheck()
                first = await resp.next_chunk()
                if not first:
                    raise Failed(stage, "the stream ended before its first event")
                n = check.feed(first)
            except asyncio.CancelledError:
                why = guard.caught("backend_down", "timeout")
                if why is None:
                    raise
                if why == "timeout":
                    raise Failed(stage, guard.late) from None
                raise Failed(stage, f"taken out before the first byte ({view.health.reason})") from None
            except UPSTREAM_ERRORS as exc:
                if relay is not None and relay.why:
                    raise Failed(stage, relay.why) from None
                raise Failed(stage, f"{type(exc).__name__}: {exc}", fatal=isinstance(exc, ConnectFailed)) from None
            except (MalformedStream, UpstreamErrorEvent) as exc:
                raise Failed(stage, f"malformed stream: {exc}") from None
            guard.clear()
            del view.guards[rid]       # from here on the client has bytes: no failover
            svc.attempt_ok(view)
            if n:
                view.on_tokens(rid, n)
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + self.via(view)})
            await send({"type": "http.response.body", "body": first, "more_body": True})
            return await self._relay(view, resp, relay, check, rid, send)
        finally:
            guard.clear()
            view.guards.pop(rid, None)
            view.relays.pop(rid, None)
            if resp is not None:
                resp.release()   # kept alive if read to its end; else dropped: the backend sees us go
            svc.finish(view, rid)

    async def _answer(self, send, status: int, content: bytes, ctype: str | None, via=()) -> None:
        headers = [(b"content-type", (ctype or "application/json").encode("latin-1")),
                   (b"content-length", str(len(content)).encode()), *via]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def _assembled(self, view, resp, relay, kind, rid, req, guard, send) -> str:
        """Read the whole upstream stream into a non-streamed reply; any fault is a retry."""
        svc = self.svc
        asm = Assembler(kind)
        first = True
        try:
            async for chunk in resp.chunks():
                relay.last = time.monotonic()
                n = asm.feed(chunk)
                if first:
                    first = False
                    guard.clear()
                    view.guards.pop(rid, None)   # tokens flow: a probe's down cuts it only if idle
                    svc.attempt_ok(view)
                if n:
                    view.on_tokens(rid, n)
        except UpstreamErrorEvent as exc:
            if str(exc).startswith("malformed"):
                raise Failed("stream", str(exc)) from None
            svc.attempt_failed(view, "stream", str(exc))
            await send_json(send, 502, error_body(f"backend {view.url} sent an error instead of its "
                                                  f"reply: {exc}", "upstream_error"), self.via(view))
            return "upstream_error"
        except asyncio.CancelledError:
            if guard.caught("backend_down") is None:
                raise
            raise Failed("first_token", f"taken out before its first token ({view.health.reason})") from None
        except UPSTREAM_ERRORS as exc:
            if not asm.done:    # broken after [DONE]: the reply is whole all the same
                raise Failed("stream", relay.why or f"{type(exc).__name__}: {exc}") from None
        if not asm.complete:
            raise Failed("stream", "the stream ended before the reply was complete")
        await send_json(send, 200, asm.reply(req.prompt_tokens), self.via(view))
        return "ok"

    async def _relay(self, view, resp, relay, check, rid, send) -> str:
        """Pass the stream on, chunk by chunk; a fault ends it with an error event."""
        svc = self.svc
        why = None
        try:
            async for chunk in resp.chunks():
                relay.last = time.monotonic()
                n = check.feed(chunk)
                if n:
                    view.on_tokens(rid, n)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not check.complete:
                why = "the stream ended before the reply was complete"
        except UPSTREAM_ERRORS as exc:
            why = relay.why or f"failed mid-stream ({type(exc).__name__}: {exc})"
        except (MalformedStream, UpstreamErrorEvent) as exc:
            why = f"sent a malformed stream ({exc})"
        if why is None:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return "ok"
        svc.attempt_failed(view, "stream", why)
        event = b"data: " + dumps(error_body(f"backend {view.url}: {why}; the reply is incomplete",
                                             "upstream_error")) + b"\n\n"
        await send({"type": "http.response.body", "body": event, "more_body": False})
        return "upstream_error"


__all__ = ["Proxy", "Guard", "Failed", "send_json", "read_body", "BACKEND_HEADER"]
_ = parse_request
