"""Checking an upstream OpenAI SSE stream as it is relayed: tokens counted, bad streams caught.

A streamed reply is passed to the client as the backend sends it, chunk by chunk. The relay
also needs to know what it passes: how many events carried generated text (the in-flight
table's tokens streamed, ``view.py``), whether the stream finished (``[DONE]``, or every choice
with a finish reason) and whether it is an OpenAI stream at all. A line that is not SSE, a
``data:`` payload that is not JSON, or a JSON payload with an ``error`` raises
(``MalformedStream`` / ``UpstreamErrorEvent``): the relay ends the client's stream with an
error event and counts the request as an upstream error, instead of relaying garbage as ``ok``.

JSON is parsed with orjson when it is installed (the ``serve`` extra's optional speed-up; the
standard library's otherwise): a few microseconds per event.
"""

from __future__ import annotations

try:   # optional: ~5x faster on these small objects
    from orjson import loads as _loads
except ImportError:   # pragma: no cover - exercised where orjson is absent
    from json import loads as _loads

from .assemble import UpstreamErrorEvent

_FIELDS = (b"data", b"event", b"id", b"retry")


class MalformedStream(Exception):
    """The backend's stream is not an OpenAI SSE stream."""


class StreamCheck:
    """Feed it the stream's bytes as they are relayed; counts text events, notes the end."""

    __slots__ = ("buf", "done", "finished", "events")

    def __init__(self):
        self.buf = b""
        self.done = False        # [DONE] seen
        self.finished = False    # a finish reason seen (every choice of a one-choice stream)
        self.events = 0

    def feed(self, data: bytes) -> int:
        """Check one read; return how many of its events carried generated text."""
        if self.buf:
            data = self.buf + data
        lines = data.split(b"\n")
        self.buf = lines.pop()
        if len(self.buf) > 1 << 20:
            raise MalformedStream(f"an SSE line longer than 1 MiB ({self.buf[:60]!r}...)")
        n = 0
        for line in lines:
            if not line or line == b"\r":
                continue
            if line.startswith(b"data:"):
                n += self._event(line[5:].strip())
            elif line[0:1] != b":" and line.split(b":", 1)[0] not in _FIELDS:
                raise MalformedStream(f"not an SSE line: {line[:80]!r}")
        self.events += n
        return n

    def _event(self, payload: bytes) -> int:
        if payload == b"[DONE]":
            self.done = True
            return 0
        if self.done:
            raise MalformedStream("an event after [DONE]")
        try:
            obj = _loads(payload)
        except ValueError:
            raise MalformedStream(f"an SSE event that is not JSON: {payload[:80]!r}") from None
        if not isinstance(obj, dict):
            raise MalformedStream(f"an SSE event that is not a JSON object: {payload[:80]!r}")
        if "error" in obj:
            err = obj["error"]
            raise UpstreamErrorEvent(err.get("message", str(err)) if isinstance(err, dict) else str(err))
        got = 0
        for ch in obj.get("choices") or ():
            if not isinstance(ch, dict):
                raise MalformedStream(f"an SSE event whose choices are not objects: {payload[:80]!r}")
            text = ch.get("text")
            if text is None:
                delta = ch.get("delta")
                text = delta.get("content") or delta.get("reasoning_content") if isinstance(delta, dict) else None
            if text:
                got = 1
            if ch.get("finish_reason") is not None:
                self.finished = True
        return got

    @property
    def complete(self) -> bool:
        """The stream ended as a finished reply."""
        return self.done or self.finished
