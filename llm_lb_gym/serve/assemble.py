"""A non-streamed OpenAI reply assembled from the backend's SSE stream (``assemble_upstream``).

Why: llama.cpp's server does not abort a non-streamed request whose client closed the
connection (it runs to its end), but it cancels a streamed one at once, as vLLM does. So the
router asks the backend for a stream and builds the non-streamed reply itself: a client that
leaves closes a stream the backend does cancel, and the tokens are counted as they arrive.

What is assembled, per choice index: completions' ``text`` concatenated; chat's ``message``
from the deltas (``role``, and every string field concatenated: ``content``, and
``reasoning_content`` / ``refusal`` where a server sends them); ``finish_reason`` (the last
non-null one); top level ``id``, ``created``, ``model``, ``system_fingerprint`` from the chunks
and ``usage`` from the chunk that carries it (asked for with ``stream_options.include_usage``);
``timings`` where the backend sends them (llama.cpp's final event: its own prompt and decode
times, which its non-streamed reply carries too and the load generator reads).
A backend that sends no usage gets the router's counts (prompt tokens as it counted them,
completion tokens = content events). Requests whose stream cannot be assembled this simply
(``logprobs``, ``tools`` / ``functions``, ``best_of``) are passed through unchanged
(``needs_passthrough``).
"""

from __future__ import annotations

from .protocol import CHAT, dumps, loads

_PASSTHROUGH_FIELDS = {"logprobs": (None, False), "top_logprobs": (None,), "tools": (None, []),
                       "functions": (None, []), "best_of": (None, 1)}
"""Fields whose use keeps a request on the pass-through path, with the values that do not:
their streams are not assembled (logprobs, tool calls), or a server refuses them streamed
(vLLM: ``best_of`` > 1)."""


def needs_passthrough(body: dict) -> str | None:
    """The field that keeps a request on the pass-through path, or None."""
    for k, unused in _PASSTHROUGH_FIELDS.items():
        if k in body and body[k] not in unused:
            return k
    return None


def streamed_body(body: dict) -> bytes:
    """The request as the router sends it upstream: streamed, with usage in the last chunk."""
    return dumps({**body, "stream": True, "stream_options": {"include_usage": True}})


class UpstreamErrorEvent(Exception):
    """The backend sent an SSE ``error`` event instead of (the rest of) its reply."""


class Assembler:
    """Feed it the upstream bytes as they come; ``reply()`` is the non-streamed body."""

    __slots__ = ("chat", "buf", "texts", "roles", "finish", "top", "usage", "timings", "done", "events")

    def __init__(self, kind: str):
        self.chat = kind == CHAT
        self.buf = b""
        self.texts: dict[int, dict[str, list[str]]] = {}
        self.roles: dict[int, str] = {}
        self.finish: dict[int, str | None] = {}
        self.top: dict = {}
        self.usage: dict | None = None
        self.timings: dict | None = None
        self.done = False           # [DONE] seen
        self.events = 0             # events that carried generated text

    def feed(self, data: bytes) -> int:
        """Take one read's bytes; return the number of events in it that carried text."""
        lines = (self.buf + data).split(b"\n")
        self.buf = lines.pop()
        before = self.events
        for line in lines:
            if line.startswith(b"data:"):
                self._event(line[5:].strip())
        return self.events - before

    def _event(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            obj = loads(payload)
        except ValueError:
            raise UpstreamErrorEvent(f"malformed SSE event {payload[:80]!r}") from None
        if "error" in obj:
            err = obj["error"]
            raise UpstreamErrorEvent(err.get("message", str(err)) if isinstance(err, dict) else str(err))
        if not self.top:
            self.top = {k: obj[k] for k in ("id", "created", "model", "system_fingerprint") if k in obj}
        if obj.get("usage"):
            self.usage = obj["usage"]
        if obj.get("timings"):
            self.timings = obj["timings"]
        for ch in obj.get("choices") or ():
            i = ch.get("index", 0)
            parts = self.texts.setdefault(i, {})
            if self.chat:
                delta = ch.get("delta") or {}
                got = False
                for k, v in delta.items():
                    if k == "role":
                        self.roles[i] = v
                    elif isinstance(v, str) and v:
                        parts.setdefault(k, []).append(v)
                        got = True
            else:
                text = ch.get("text")
                got = bool(text)
                if got:
                    parts.setdefault("text", []).append(text)
            self.events += got
            if ch.get("finish_reason") is not None:
                self.finish[i] = ch["finish_reason"]
            else:
                self.finish.setdefault(i, None)

    @property
    def complete(self) -> bool:
        """The stream ended as a finished reply: [DONE], or every choice has a finish reason."""
        return self.done or (bool(self.finish) and all(f is not None for f in self.finish.values()))

    def reply(self, prompt_tokens: int) -> dict:
        """The OpenAI non-streamed body; ``prompt_tokens``: the router's count, used only when
        the backend sent no usage."""
        if self.buf.strip():
            self.feed(b"\n")
        choices = []
        for i in sorted(self.texts):
            parts = {k: "".join(v) for k, v in self.texts[i].items()}
            if self.chat:
                message = {"role": self.roles.get(i, "assistant"), "content": parts.pop("content", ""),
                           **parts}
                choices.append({"index": i, "message": message, "finish_reason": self.finish.get(i)})
            else:
                choices.append({"index": i, "text": parts.get("text", ""), "logprobs": None,
                                "finish_reason": self.finish.get(i)})
        usage = self.usage or {"prompt_tokens": prompt_tokens, "completion_tokens": self.events,
                               "total_tokens": prompt_tokens + self.events}
        obj = "chat.completion" if self.chat else "text_completion"
        return {"id": self.top.get("id", ""), "object": obj, "created": self.top.get("created", 0),
                "model": self.top.get("model", ""), "choices": choices, "usage": usage,
                **({"system_fingerprint": self.top["system_fingerprint"]}
                   if "system_fingerprint" in self.top else {}),
                **({"timings": self.timings} if self.timings else {})}
