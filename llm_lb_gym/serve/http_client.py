"""The router's upstream HTTP/1.1 client: kept-alive connections per backend, httptools' parser.

Why not aiohttp's client for the requests themselves (the probes and scrapes still use it):
per short request, one at a time against a simulated backend on this machine, aiohttp's
client spent 420-510 us of CPU (its request and response objects, header multidicts, tracing
hooks, payload writers, timers), this one 120-160 us (``/tmp``-style probe, documented in
docs/serving.md, Speed). The router is a proxy: it sends a request it has already serialised
and reads a reply it mostly passes on, so it needs a connection pool, one write per request, a
parser (httptools, the one uvicorn uses for the other side) and a body read chunk by chunk with
an idle deadline; nothing more.

What it does: ``Pool.request`` takes an idle connection to the backend (or connects, within
``connect_timeout_s``), writes the request in one ``write``, and returns a ``Response`` once
the status line and headers are parsed. ``Response.read`` / ``Response.chunks`` give the body
(chunked or sized: httptools decodes both), each wait bounded by ``idle_timeout_s``.
``release`` puts a connection whose reply was read to its end back in the pool (keep-alive);
``close`` drops it (the backend sees the client go: how vLLM and llama.cpp abort a request). A
kept-alive connection that the backend closed while idle fails before any byte of the reply;
the request is then sent once more on a fresh connection, as any HTTP client does.

Errors are ``ConnectionError`` subclasses: ``ConnectFailed`` (refused, unreachable, or not
within the deadline: the backend is gone), ``IdleTimeout`` (also a ``TimeoutError``),
``ConnectionClosed`` (closed or reset mid-reply), ``BadResponse`` (not HTTP).
"""

from __future__ import annotations

import asyncio
from collections import deque

import httptools


class UpstreamHTTPError(ConnectionError):
    """A backend connection or reply failed."""


class ConnectFailed(UpstreamHTTPError):
    """No connection: refused, unreachable, or not made within the connect deadline."""


class ConnectionClosed(UpstreamHTTPError):
    """The backend closed or reset the connection before its reply was complete."""


class BadResponse(UpstreamHTTPError):
    """What came back is not an HTTP/1.1 response."""


class IdleTimeout(UpstreamHTTPError, TimeoutError):
    """The backend sent nothing for the idle deadline."""


class _Conn(asyncio.Protocol):
    """One kept-alive connection; parses the reply in flight (one at a time)."""

    __slots__ = ("pool", "key", "transport", "parser", "headers_fut", "waiter", "buf", "status",
                 "headers", "done", "error", "closed", "got_bytes", "keep_alive")

    def __init__(self, pool: "Pool", key):
        self.pool, self.key = pool, key
        self.transport = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self.headers_fut: asyncio.Future | None = None
        self.waiter: asyncio.Future | None = None
        self.buf: list[bytes] = []
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.done = False
        self.error: Exception | None = None
        self.got_bytes = False
        self.keep_alive = False

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"not an HTTP response: {exc}"))
            self.transport.close()
            return
        self._wake()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if not self.done:
            self._fail(ConnectionClosed("the backend closed the connection" + (f": {exc}" if exc else "")))

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()   # known here, not after the body
        f = self.headers_fut
        if f is not None and not f.done():
            f.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.buf.append(body)

    def on_message_complete(self) -> None:
        self.done = True

    # -- internals
    def _fail(self, exc: Exception) -> None:
        if self.error is None:
            self.error = exc
        f = self.headers_fut
        if f is not None and not f.done():
            f.set_exception(exc)
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


class Response:
    """A backend's reply: ``status``, ``headers`` (lower-case bytes names), then the body."""

    __slots__ = ("conn", "status", "headers", "idle_timeout_s", "released")

    def __init__(self, conn: _Conn, idle_timeout_s: float):
        self.conn, self.status, self.headers = conn, conn.status, conn.headers
        self.idle_timeout_s = idle_timeout_s
        self.released = False

    def content_type(self, default: str = "application/json") -> str:
        v = self.headers.get(b"content-type")
        return v.decode("latin-1") if v else default

    async def _more(self) -> None:
        c = self.conn
        loop = asyncio.get_running_loop()
        w = c.waiter = loop.create_future()
        timer = loop.call_later(self.idle_timeout_s, _expire, w, self.idle_timeout_s)
        try:
            await w
        finally:
            timer.cancel()
            c.waiter = None

    async def chunks(self):
        """The body as it comes, one piece per read (empty pieces skipped)."""
        c = self.conn
        while True:
            if c.buf:
                data = b"".join(c.buf) if len(c.buf) > 1 else c.buf[0]
                c.buf = []
                yield data
                continue
            if c.done:
                return
            if c.error is not None:
                raise c.error
            await self._more()

    async def next_chunk(self) -> bytes:
        """The next piece of the body; b"" at its end."""
        async for chunk in self.chunks():
            return chunk
        return b""

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body (or its first ``limit`` bytes, then the connection is dropped)."""
        parts, n = [], 0
        async for chunk in self.chunks():
            parts.append(chunk)
            n += len(chunk)
            if limit is not None and n >= limit:
                self.close()
                break
        return b"".join(parts)

    @property
    def complete(self) -> bool:
        """The reply was read to its end (``release`` then keeps the connection)."""
        return self.conn.done and not self.conn.buf and self.conn.error is None

    def release(self) -> None:
        """Done with the reply: a complete one gives the connection back, else it is dropped."""
        if self.released:
            return
        self.released = True
        c = self.conn
        if self.complete and not c.closed and c.keep_alive:
            c._reset()
            c.pool._put(c)
        else:
            self.close()

    def close(self) -> None:
        """Drop the connection (the backend sees the client go)."""
        self.released = True
        c = self.conn
        c.closed = True
        if c.transport is not None:
            c.transport.close()


def _expire(w: asyncio.Future, seconds: float) -> None:
    if not w.done():
        w.set_exception(IdleTimeout(f"nothing from the backend for {seconds} s"))


def backend_address(url: str) -> tuple[tuple, str]:
    """((host, port, tls), path prefix) of a backend base URL (``http://127.0.0.1:8001``)."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    tls = u.scheme == "https"
    return (u.hostname or "127.0.0.1", u.port or (443 if tls else 80), tls), u.path.rstrip("/")


class Pool:
    """Kept-alive connections per backend (host, port, tls)."""

    def __init__(self, connect_timeout_s: float, max_idle_per_backend: int = 512):
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle_per_backend
        self.idle: dict[tuple[str, int], deque[_Conn]] = {}
        self._heads: dict[tuple, bytes] = {}

    def _put(self, c: _Conn) -> None:
        q = self.idle.setdefault(c.key, deque())
        if len(q) < self.max_idle:
            q.append(c)
        else:
            c.transport.close()

    async def _connect(self, key) -> _Conn:
        loop = asyncio.get_running_loop()
        host, port, tls = key
        ssl = None
        if tls:
            import ssl as _ssl

            ssl = _ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self, key), host, port, ssl=ssl,
                                       server_hostname=host if tls else None),
                self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise ConnectFailed(f"no connection to {key[0]}:{key[1]} within {self.connect_timeout_s} s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {key[0]}:{key[1]}: {exc}") from None
        return conn

    def _head(self, key, path: str, n: int, auth: str | None) -> bytes:
        k = (key, path, n, auth)
        h = self._heads.get(k)
        if h is None:
            lines = [f"POST {path} HTTP/1.1", f"host: {key[0]}:{key[1]}", "content-type: application/json",
                     f"content-length: {n}"]
            if auth:
                lines.append(f"authorization: {auth}")
            h = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
            if len(self._heads) < 4096:
                self._heads[k] = h
        return h

    async def request(self, key: tuple, path: str, body: bytes, idle_timeout_s: float,
                      auth: str | None = None) -> Response:
        """POST ``body`` (JSON) to ``path`` on backend ``key``; returns once the headers are in."""
        head = self._head(key, path, len(body), auth)
        q = self.idle.get(key)
        for fresh in (False, True):
            conn = None
            if not fresh:
                while q:
                    c = q.pop()
                    if not c.closed:
                        conn = c
                        break
                if conn is None:
                    fresh = True
            if conn is None:
                conn = await self._connect(key)
            loop = asyncio.get_running_loop()
            conn.headers_fut = loop.create_future()
            conn.transport.write(head + body)
            try:
                await conn.headers_fut
            except ConnectionClosed:
                if not fresh and not conn.got_bytes:
                    continue    # a kept-alive connection the backend had closed: once more, fresh
                raise
            except BaseException:
                conn.closed = True
                conn.transport.close()
                raise
            conn.headers_fut = None
            return Response(conn, idle_timeout_s)
        raise AssertionError("unreachable")

    def close(self) -> None:
        for q in self.idle.values():
            for c in q:
                if c.transport is not None:
                    c.transport.close()
        self.idle.clear()
