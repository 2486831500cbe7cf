"""The OpenAI request bodies the router and the simulated backend accept, validated up front.

Both servers parse a request once, before any routing: a body that is not JSON, names a model
the service does not serve, or cannot fit the context window gets a 4xx with the reason in
OpenAI's error shape (``{"error": {"message", "type", "param", "code"}}``), never a 500 and
never a request that reaches a backend only to fail there. The router needs three numbers from
the body to build its view of a backend (prompt tokens, requested output tokens, whether the
reply streams); everything else is passed to the backend untouched.

Limits and types. A body deeper than ``max_depth`` (64) levels of arrays and objects or larger
than the service's ``max_body_bytes`` (read incrementally, ``router_app.py``) is refused; every
field OpenAI defines that the body carries is type-checked (``_FIELD_TYPES``: ``temperature``
a number, ``stop`` a string or a list of strings, content parts objects whose ``text`` is a
string, ...), so nothing a client sends turns into a 500 at the router or a crash upstream.
Fields the router does not know (a server's extensions, e.g. vLLM's ``ignore_eos``) pass.

Token counting: with ``tokenizer`` (a local Hugging Face tokenizer directory, the served
model's) prompts are counted exactly as the backend will; without it, the count is the number
of whitespace-separated words, which is what the simulated backend uses too and what the load
generator's synthetic prompts are built from (one word per token), so router and backend agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

try:   # optional (the serve extra): a C parser, several times faster, depth-limited itself
    from orjson import dumps as _dumps
    from orjson import loads as _loads

    def dumps(obj) -> bytes:
        return _dumps(obj)
except ImportError:   # pragma: no cover - exercised where orjson is absent
    _loads = json.loads

    def dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

loads = _loads
MAX_DEPTH = 64
"""Deepest nesting of arrays / objects accepted in a request body."""

COMPLETIONS = "completions"
CHAT = "chat"
DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for completions; used for both endpoints when absent."""


class BadRequest(Exception):
    """A request the service refuses, with the HTTP status and the OpenAI error fields."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": "invalid_request_error",
                          "param": self.param, "code": self.code}}


def error_body(message: str, code: str, param: str | None = None) -> dict:
    """OpenAI's error shape for errors that are not the client's (502, 503, 504)."""
    return {"error": {"message": message, "type": "server_error", "param": param, "code": code}}


@dataclass(frozen=True)
class ParsedRequest:
    """What the router and the backend need to know of one request."""

    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    body: dict


def word_count(text: str) -> int:
    return len(text.split())


def make_counter(tokenizer: str | None) -> Callable[[str], int]:
    """Prompt-token counter: the served model's tokenizer (a local directory), or words."""
    if tokenizer is None:
        return word_count
    from transformers import AutoTokenizer   # lazy: heavy, and only needed with a tokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    return lambda text: len(tok.encode(text, add_special_tokens=False))


_NUMBER = (int, float)
_FIELD_TYPES: dict[str, tuple[tuple, str]] = {
    "temperature": (_NUMBER, "a number"), "top_p": (_NUMBER, "a number"),
    "presence_penalty": (_NUMBER, "a number"), "frequency_penalty": (_NUMBER, "a number"),
    "repetition_penalty": (_NUMBER, "a number"), "min_p": (_NUMBER, "a number"),
    "top_k": ((int,), "an integer"), "seed": ((int,), "an integer"),
    "user": ((str,), "a string"), "suffix": ((str,), "a string"),
    "echo": ((bool,), "true or false"), "ignore_eos": ((bool,), "true or false"),
    "stream_options": ((dict,), "an object"), "logit_bias": ((dict,), "an object"),
    "response_format": ((dict,), "an object"), "tools": ((list,), "a list"),
    "functions": ((list,), "a list"), "best_of": ((int,), "an integer"),
    "top_logprobs": ((int,), "an integer"), "n": ((int,), "an integer"),
}
"""OpenAI fields checked when present (null passes: OpenAI's clients send it for "unset")."""


def _check_fields(body: dict) -> None:
    for name, v in body.items():   # a body holds a few keys: look each up, not every known field
        spec = _FIELD_TYPES.get(name)
        if spec is None or v is None:
            continue
        types, what = spec
        if isinstance(v, bool) and bool not in types or not isinstance(v, types):
            raise BadRequest(400, f"'{name}' must be {what}, got {type(v).__name__}", name)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(x, str) for x in stop)):
        raise BadRequest(400, "'stop' must be a string or a list of strings", "stop")
    lp = body.get("logprobs")
    if lp is not None and (not isinstance(lp, (bool, int))):
        raise BadRequest(400, f"'logprobs' must be a boolean or an integer, got {type(lp).__name__}",
                         "logprobs")
    opts = body.get("stream_options")
    if isinstance(opts, dict) and not isinstance(opts.get("include_usage", False), bool):
        raise BadRequest(400, "'stream_options.include_usage' must be true or false", "stream_options")


def _depth_ok(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests at most ``limit`` arrays / objects deep (iterative: no recursion)."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            return False
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values() if isinstance(v, (dict, list)))
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o if isinstance(v, (dict, list)))
    return True


def _content_text(i: int, content) -> str:
    """The countable text of ``messages[i].content``: a string, null, or a list of parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise BadRequest(400, f"messages[{i}].content must be a string, null or a list of parts, "
                              f"got {type(content).__name__}", "messages")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type", "text"), str):
            raise BadRequest(400, f"messages[{i}].content[{j}] must be an object with a string 'type'",
                             "messages")
        if part.get("type", "text") == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise BadRequest(400, f"messages[{i}].content[{j}].text must be a string, got "
                                      f"{type(text).__name__}", "messages")
            texts.append(text)
    return " ".join(texts)


def _prompt_text(kind: str, body: dict) -> str:
    if kind == COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return prompt[0]
        raise BadRequest(400, "'prompt' must be a string (or a list of one string); "
                              f"got {type(prompt).__name__}", "prompt")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(400, "'messages' must be a non-empty list of {role, content} objects",
                         "messages")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(400, f"messages[{i}] must be an object with a string 'role'", "messages")
        if "name" in m and not isinstance(m["name"], str):
            raise BadRequest(400, f"messages[{i}].name must be a string", "messages")
        parts.append(_content_text(i, m.get("content")))
    return "\n".join(parts)


def parse_request(raw: bytes, kind: str, models: tuple[str, ...], context_tokens: int,
                  count: Callable[[str], int] = word_count, max_depth: int = MAX_DEPTH) -> ParsedRequest:
    """Validate an OpenAI completions / chat body; raise ``BadRequest`` naming what is wrong.

    ``models``: the names served (an unknown one is a 404, as OpenAI answers);
    ``context_tokens``: prompt + max_tokens may not exceed it (a 400 with both numbers)."""
    try:
        body: Any = loads(raw)
    except RecursionError:
        raise BadRequest(400, f"request body nests deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError, TypeError) as exc:
        if "depth" in str(exc) or "recursion" in str(exc):
            raise BadRequest(400, f"request body nests deeper than {max_depth} levels") from None
        raise BadRequest(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, f"request body must be a JSON object, got {type(body).__name__}")
    if not _depth_ok(body, max_depth):
        raise BadRequest(400, f"request body nests deeper than {max_depth} levels")
    model = body.get("model")
    if not isinstance(model, str):
        raise BadRequest(400, "'model' is required (a string); allowed: " + ", ".join(models), "model")
    if model not in models:
        raise BadRequest(404, f"model {model!r} does not exist; allowed: {', '.join(models)}",
                         "model", "model_not_found")
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(400, f"'max_tokens' must be an integer >= 1, got {max_tokens!r}", "max_tokens")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest(400, f"'stream' must be true or false, got {stream!r}", "stream")
    _check_fields(body)
    n = body.get("n", 1)
    if n not in (1, None):
        raise BadRequest(400, f"'n' must be 1 (one completion per request), got {n!r}", "n")
    prompt_tokens = count(_prompt_text(kind, body))
    if prompt_tokens + max_tokens > context_tokens:
        raise BadRequest(
            400, f"This model's maximum context length is {context_tokens} tokens. However, you "
                 f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
                 f"{max_tokens} for the completion). Reduce the prompt or max_tokens.",
            "max_tokens", "context_length_exceeded")
    return ParsedRequest(model, prompt_tokens, max_tokens, stream, body)
