"""Per protocol: where a call goes, how its key travels, a valid body, and what its errors and streams look like."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Protocol:
    name: str
    path: str
    stream_path: str
    key_header: str

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if self.key_header == "bearer" else {self.key_header: key}

    def body(self, text: str = "hi", *, stream: bool = False, max_tokens: int = 2) -> dict[str, Any]:
        if self.name == "openai_chat":
            return {"model": "tiny", "max_tokens": max_tokens, "stream": stream, "messages": [_user(text)]}
        if self.name == "openai_responses":
            return {"model": "tiny", "max_output_tokens": max_tokens, "stream": stream, "input": text}
        if self.name == "anthropic":
            return {"model": "tiny", "max_tokens": max_tokens, "stream": stream, "messages": [_user(text)]}
        return {
            "contents": [{"role": "user", "parts": [{"text": text}]}],
            "generationConfig": {"maxOutputTokens": max_tokens},
        }

    def url(self, stream: bool) -> str:
        """Gemini streams by path; the others by the body's ``stream``."""
        return self.stream_path if stream else self.path


PROTOCOLS = {
    p.name: p
    for p in (
        Protocol("openai_chat", "/v1/chat/completions", "/v1/chat/completions", "bearer"),
        Protocol("openai_responses", "/v1/responses", "/v1/responses", "bearer"),
        Protocol("anthropic", "/v1/messages", "/v1/messages", "x-api-key"),
        Protocol(
            "gemini",
            "/v1beta/models/tiny:generateContent",
            "/v1beta/models/tiny:streamGenerateContent?alt=sse",
            "x-goog-api-key",
        ),
    )
}


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def error_problem(protocol: str, status: int, body: Any) -> str | None:
    """Why ``body`` is not an error in ``protocol``'s shape (None when it is)."""
    if protocol in ("openai_chat", "openai_responses"):
        error = body.get("error") if isinstance(body, dict) else None
        ok = isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)
        return None if ok else f"not an OpenAI error: {body!r:.300}"
    if protocol == "anthropic":
        error = body.get("error") if isinstance(body, dict) else None
        ok = (
            body.get("type") == "error"
            and isinstance(error, dict)
            and isinstance(error.get("type"), str)
            and isinstance(error.get("message"), str)
        )
        return None if ok else f"not an Anthropic error: {body!r:.300}"
    error = body.get("error") if isinstance(body, dict) else None
    ok = (
        isinstance(error, dict)
        and error.get("code") == status
        and isinstance(error.get("status"), str)
        and isinstance(error.get("message"), str)
    )
    return None if ok else f"not a Gemini error: {body!r:.300}"


def sse_data(text: str) -> list[Any]:
    """The JSON payloads of an SSE body's data lines ("[DONE]" kept as a string)."""
    out: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def stream_outcome(protocol: str, text: str) -> str:
    """``"complete"``, ``"error"`` (an in-protocol error event ends it) or ``"cut"`` (neither)."""
    events = sse_data(text)
    dicts = [e for e in events if isinstance(e, dict)]
    if protocol == "openai_chat":
        if any("error" in e for e in dicts):
            return "error"
        return "complete" if events and events[-1] == "[DONE]" else "cut"
    if protocol == "openai_responses":
        kinds = [e.get("type") for e in dicts]
        if "error" in kinds or "response.failed" in kinds:
            return "error"
        return "complete" if kinds and kinds[-1] in ("response.completed", "response.incomplete") else "cut"
    if protocol == "anthropic":
        kinds = [e.get("type") for e in dicts]
        if "error" in kinds:
            return "error"
        return "complete" if kinds and kinds[-1] == "message_stop" else "cut"
    if any("error" in e for e in dicts):
        return "error"
    finished = dicts and any(c.get("finishReason") for c in dicts[-1].get("candidates", []))
    return "complete" if finished else "cut"
