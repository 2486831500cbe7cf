"""The OpenAI request bodies the router and the simulated backend accept, validated up front.

Both servers parse a request once, before any routing: a body that is not JSON, names a model
the service does not serve, or cannot fit the context window gets a 4xx with the reason in
OpenAI's error shape (``{"error": {"message", "type", "param", "code"}}``), never a 500 and
never a request that reaches a backend only to fail there. The router needs three numbers from
the body to build its view of a backend (prompt tokens, requested output tokens, whether the
reply streams); everything else is passed to the backend untouched.

Token counting: with ``tokenizer`` (a local Hugging Face tokenizer directory, the served
model's) prompts are counted exactly as the backend will; without it, the count is the number
of whitespace-separated words, which is what the simulated backend uses too and what the load
generator's synthetic prompts are built from (one word per token), so router and backend agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

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
        content = m.get("content", "")
        if isinstance(content, list):   # content parts: count the text ones
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise BadRequest(400, f"messages[{i}].content must be a string or a list of parts",
                             "messages")
        parts.append(content)
    return "\n".join(parts)


def parse_request(raw: bytes, kind: str, models: tuple[str, ...], context_tokens: int,
                  count: Callable[[str], int] = word_count) -> ParsedRequest:
    """Validate an OpenAI completions / chat body; raise ``BadRequest`` naming what is wrong.

    ``models``: the names served (an unknown one is a 404, as OpenAI answers);
    ``context_tokens``: prompt + max_tokens may not exceed it (a 400 with both numbers)."""
    try:
        body: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, f"request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str):
        raise BadRequest(400, "'model' is required (a string); allowed: " + ", ".join(models), "model")
    if model not in models:
        raise BadRequest(404, f"model {model!r} does not exist; allowed: {', '.join(models)}",
                         "model", "model_not_found")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", DEFAULT_MAX_TOKENS))
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(400, f"'max_tokens' must be an integer >= 1, got {max_tokens!r}", "max_tokens")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(400, f"'stream' must be true or false, got {stream!r}", "stream")
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest(400, f"'n' must be 1 (one completion per request), got {n!r}", "n")
    prompt_tokens = count(_prompt_text(kind, body))
    if prompt_tokens + max_tokens > context_tokens:
        raise BadRequest(
            400, f"This model's maximum context length is {context_tokens} tokens. However, you "
                 f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
                 f"{max_tokens} for the completion). Reduce the prompt or max_tokens.",
            "max_tokens", "context_length_exceeded")
    return ParsedRequest(model, prompt_tokens, max_tokens, stream, body)
