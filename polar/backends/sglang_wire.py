"""SGLang's ``/generate`` wire format, read strictly: output ids, logprob triples, finish reasons, version spans,
SSE events and error bodies (mapped to polar's errors). Used by ``polar.backends.sglang``."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from polar.backends.http1 import Reply
from polar.errors import (
    BackendError,
    BackendProtocolError,
    BackendUnavailable,
    ContextLengthExceeded,
    InvalidRequest,
    PolarError,
    UnknownSamplingParameter,
)
from polar.inference import FinishReason, GenerateRequest, GenerateResult, LogprobSemantics, VersionSpan

# Keys under which servers report the context window, in order of preference (/model_info, then /v1/models).
CONTEXT_KEYS = ("max_context_length", "context_length", "max_model_len")
_UNKNOWN_PARAM = re.compile(r"unknown (?:sampling parameter|field)\s+'?([A-Za-z_][\w.]*)'?")
_CONTEXT_MESSAGE = re.compile(r"context (?:length|window)", re.IGNORECASE)
_NUMBER = re.compile(r"\d+")
_NOT_FINAL = re.compile(r'"finish_reason"\s*:\s*null')


def sampling_params_json(request: GenerateRequest) -> dict[str, Any]:
    """polar's SamplingParams under SGLang's names: lists for tuples, ``seed`` as ``sampling_seed``."""
    params = request.sampling.model_dump()
    seed = params.pop("seed")
    params["stop"] = list(params["stop"])
    params["stop_token_ids"] = list(params["stop_token_ids"])
    if seed is not None:
        params["sampling_seed"] = seed
    return params


@dataclass
class OutputReader:
    """Accumulates a response or a stream of cumulative or incremental chunks, checking every field."""

    url: str
    request: GenerateRequest
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ttft_s: float | None = None

    def add(self, payload: Any) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Take one response/chunk; return the ids and logprobs it adds.

        Only what is new is checked and copied: a cumulative chunk's already-streamed part is checked at its
        length and its last id (so a long output costs linear time, not quadratic), its new tail in full."""
        if not isinstance(payload, dict):
            raise BackendProtocolError(f"{self.url}: expected a JSON object, got {type(payload).__name__}")
        meta = payload.get("meta_info")
        if not isinstance(meta, dict):
            raise BackendProtocolError(f"{self.url}: the response has no meta_info object")
        ids = payload.get("output_ids")
        if not isinstance(ids, list):
            raise BackendProtocolError(f"{self.url}: output_ids is missing or not a list of integers")
        triples = meta.get("output_token_logprobs")
        if not isinstance(triples, list):
            raise BackendProtocolError(f"{self.url}: meta_info.output_token_logprobs is missing (return_logprob)")
        if len(triples) != len(ids):
            raise BackendProtocolError(f"{self.url}: {len(triples)} output_token_logprobs for {len(ids)} output_ids")
        total = meta.get("completion_tokens")
        if not isinstance(total, int) or isinstance(total, bool):
            raise BackendProtocolError(f"{self.url}: meta_info.completion_tokens is missing")
        seen = len(self.ids)
        if len(ids) == total:  # cumulative (or the first chunk, where both readings agree)
            if len(ids) < seen or (seen and ids[seen - 1] != self.ids[-1]):
                raise BackendProtocolError(f"{self.url}: a cumulative chunk rewrote output ids already streamed")
            start = seen
        elif seen + len(ids) == total:  # incremental
            start = 0
        else:
            raise BackendProtocolError(
                f"{self.url}: a chunk with {len(ids)} output_ids and completion_tokens={total} fits neither "
                f"cumulative nor incremental streaming after {seen} tokens"
            )
        new_ids = _int_list(ids[start:] if start else ids, "output_ids", self.url)
        new_logprobs = _logprobs_of(triples[start:] if start else triples, new_ids, self.url, offset=start)
        self.ids.extend(new_ids)
        self.logprobs.extend(new_logprobs)
        return tuple(new_ids), tuple(new_logprobs)

    def result(self, payload: dict[str, Any]) -> GenerateResult:
        meta = payload["meta_info"]
        reason, matched = _finish_of(meta.get("finish_reason"), self.url)
        prompt_tokens = meta.get("prompt_tokens")
        if not isinstance(prompt_tokens, int) or isinstance(prompt_tokens, bool):
            raise BackendProtocolError(f"{self.url}: meta_info.prompt_tokens is missing")
        latency = meta.get("e2e_latency")  # finite and >= 0: polar.proxy.call.output_check checks every result
        return GenerateResult(
            output_ids=tuple(self.ids),
            output_logprobs=tuple(self.logprobs),
            finish_reason=reason,
            matched_stop=matched,
            version_spans=_spans_of(meta, len(self.ids), self.url),
            prompt_tokens=prompt_tokens,
            logprob_semantics=LogprobSemantics.TEMPERATURE_SCALED,
            ttft_s=self.ttft_s,
            e2e_s=float(latency) if isinstance(latency, int | float) and not isinstance(latency, bool) else None,
        )


def _int_list(value: Any, name: str, url: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise BackendProtocolError(f"{url}: {name} is missing or not a list of integers")
    return value


def _logprobs_of(triples: list[Any], ids: list[int], url: str, offset: int = 0) -> list[float]:
    logprobs = []
    for i, (triple, token) in enumerate(zip(triples, ids, strict=True), start=offset):
        if not (
            isinstance(triple, list)
            and len(triple) >= 2
            and isinstance(triple[0], int | float)
            and not isinstance(triple[0], bool)
        ):
            raise BackendProtocolError(f"{url}: output_token_logprobs[{i}] is not a [logprob, id, text] triple")
        if triple[1] != token:
            raise BackendProtocolError(
                f"{url}: output_token_logprobs[{i}] is for token {triple[1]} but output_ids[{i}] is {token}"
            )
        logprobs.append(float(triple[0]))
    return logprobs


def _finish_of(value: Any, url: str) -> tuple[FinishReason, int | str | None]:
    if not isinstance(value, dict) or value.get("type") not in ("stop", "length", "abort"):
        raise BackendProtocolError(f"{url}: finish_reason {value!r:.200} is not a stop/length/abort dict")
    reason = FinishReason(value["type"])
    matched = value.get("matched") if reason is FinishReason.STOP else None
    if matched is not None and (isinstance(matched, bool) or not isinstance(matched, int | str)):
        raise BackendProtocolError(f"{url}: finish_reason.matched {matched!r} is neither a token id nor a string")
    return reason, matched


def _spans_of(meta: dict[str, Any], n_output: int, url: str) -> tuple[VersionSpan, ...]:
    raw = meta.get("weight_versions")
    if raw is None:
        version = meta.get("weight_version")
        if not isinstance(version, str):
            raise BackendProtocolError(f"{url}: meta_info has neither weight_versions nor weight_version")
        return (VersionSpan(version, 0, n_output),)
    if not isinstance(raw, list) or not all(_is_span(s) for s in raw):
        raise BackendProtocolError(
            f"{url}: meta_info.weight_versions {raw!r:.200} is not a list of {{version: string, start: integer, "
            "end: integer}"
        )
    spans = tuple(VersionSpan(s["version"], s["start"], s["end"]) for s in raw)
    contiguous = all(a.end == b.start for a, b in zip(spans, spans[1:], strict=False))
    if not spans or spans[0].start != 0 or spans[-1].end != n_output or not contiguous:
        raise BackendProtocolError(f"{url}: weight_versions {raw!r:.200} do not cover the {n_output} output tokens")
    return spans


def _is_span(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("version"), str)
        and all(isinstance(value.get(k), int) and not isinstance(value.get(k), bool) for k in ("start", "end"))
    )


async def sse_batches(response: Reply, url: str) -> AsyncIterator[list[Any]]:
    """The JSON objects of ``data:`` events up to ``data: [DONE]``, grouped by the read they arrived in; of a
    group of cumulative chunks only the last is decoded (it holds all the others say: ``latest``).

    A server that ignored ``stream`` and answered one JSON body yields that body as the only payload.
    """
    if response.headers.get("content-type", "").startswith("application/json"):
        await response.aread()
        yield [json_of(response, url)]
        return
    async for lines in response.aiter_line_batches():
        data: list[str] = []
        for line in lines:
            if not line.startswith("data:"):
                if line and not line.startswith((":", "event:", "id:", "retry:")):
                    raise BackendProtocolError(f"{url}: not a server-sent event line: {line[:200]!r}")
                continue  # blank separators, comments, named-event fields
            event = line[5:].strip()
            if event != "[DONE]":  # read on to the end of the body: the connection can then be reused
                data.append(event)
        if data:
            yield latest(data, url)


def latest(data: list[str], url: str) -> list[Any]:
    """The events to decode of ``data`` (events that arrived together): the last alone when it is a cumulative
    chunk (its ``output_ids`` are all ``completion_tokens``, so it repeats every earlier one), else all of them.
    A gateway behind on a long output then decodes one chunk per read, not every chunk (quadratic)."""
    last = _loads(data[-1], url)
    if len(data) > 1 and not _cumulative(last):
        return [*(_loads(event, url) for event in data[:-1]), last]
    for event in data[:-1]:
        # Not decoded (the last repeats them), but each must be a JSON object that is neither an error nor a final
        # chunk (nothing may follow that): a text search says so for an ordinary chunk; any other is decoded.
        if not event.startswith("{"):
            raise BackendProtocolError(f"{url}: a stream event is not a JSON object: {event[:200]!r}")
        if '"error"' in event or not _NOT_FINAL.search(event):
            return [*(_loads(event, url) for event in data[:-1]), last]
    return [last]


def _cumulative(payload: Any) -> bool:
    if not isinstance(payload, dict) or "error" in payload:
        return False
    meta, ids = payload.get("meta_info"), payload.get("output_ids")
    return isinstance(meta, dict) and isinstance(ids, list) and meta.get("completion_tokens") == len(ids) > 0


def _loads(data: str, url: str) -> Any:
    """orjson, then the standard parser for what orjson refuses (NaN, which a checked field then names)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        raise BackendProtocolError(f"{url}: a stream event is not JSON: {data[:200]!r}") from None


def json_of(response: httpx.Response | Reply, url: str, *, allow_error: bool = False) -> Any:
    if response.status_code >= 400 and not allow_error:
        raise BackendProtocolError(f"{url} answered HTTP {response.status_code}")
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BackendProtocolError(f"{url} did not answer JSON: {response.text[:200]!r}") from None


def message_of(payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    candidates = [error.get("message") if isinstance(error, dict) else None]
    candidates += [payload.get(key) for key in ("message", "detail", "error")]
    return next((text for text in candidates if isinstance(text, str)), None)


def http_error(
    response: httpx.Response | Reply, url: str, request: GenerateRequest | None, model_info: Mapping[str, Any]
) -> PolarError:
    try:
        payload = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        payload = None
    if message_of(payload) is None:
        payload = {"error": {"message": response.text[:300] or response.reason_phrase}}
    return error_from_body(payload, response.status_code, url, request, model_info)


def error_from_body(
    payload: dict[str, Any],
    status: int,
    url: str,
    request: GenerateRequest | None,
    model_info: Mapping[str, Any],
    *,
    in_stream: bool = False,
) -> PolarError:
    """Map an SGLang error body to polar's errors, keeping the server's message."""
    message = message_of(payload) or "no message"
    error = payload.get("error")
    if in_stream and isinstance(error, dict) and isinstance(error.get("code"), int):
        status = error["code"]
    if status == 400 or (400 <= status < 500 and status not in (404, 408, 429)):
        unknown = _UNKNOWN_PARAM.search(message)
        if unknown:
            return UnknownSamplingParameter(message, field=f"sampling_params.{unknown.group(1)}")
        if _CONTEXT_MESSAGE.search(message):
            prompt = len(request.input_ids) if request is not None else 0
            numbers = [int(n) for n in _NUMBER.findall(message)]
            window = context_length_of(model_info) or (max(numbers) if numbers else 0)
            exc = ContextLengthExceeded(prompt, window)
            exc.message, exc.args = message, (message,)
            return exc
        return InvalidRequest(message)
    if status in (408, 429, 503):
        return BackendUnavailable(f"{url} answered {status}: {message}")
    if status == 404:
        return BackendProtocolError(f"{url} answered 404 (is this an SGLang server?): {message}")
    return BackendError(f"{url} answered {status}: {message}")


def unavailable(exc: Exception, url: str, timeout_s: float) -> BackendUnavailable:
    """A transport failure (httpx's, or the generation client's: ``polar.backends.http1``) as BackendUnavailable
    naming the URL."""
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return BackendUnavailable(f"{url} timed out (limit {timeout_s:g} s): {type(exc).__name__}")
    return BackendUnavailable(f"cannot reach {url}: {type(exc).__name__}: {exc}")


def context_length_of(info: Mapping[str, Any]) -> int | None:
    for key in CONTEXT_KEYS:
        value = info.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
