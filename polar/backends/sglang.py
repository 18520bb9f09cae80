"""The ``sglang`` backend: SGLang's native ``/generate`` with ``input_ids`` (token in, token out).

Requests carry the prompt ids, the sampling parameters under SGLang's names (``seed`` is sent as
``sampling_seed``), ``return_logprob: true`` and a ``rid``. Responses are read strictly: ``output_ids``,
``meta_info.output_token_logprobs`` as ``[logprob, id, text]`` triples whose ids must equal the output
ids, the finish-reason dict, ``weight_versions`` spans (or one span from ``weight_version``) and
``e2e_latency``. Logprobs have SGLang's default semantics (temperature-scaled when sampling).

Streams may be cumulative (SGLang's default) or incremental (``--incremental-streaming-output``); each
chunk is classified on its own by comparing its ``output_ids`` with ``meta_info.completion_tokens``.

Errors: unreachable server or timeout -> BackendUnavailable (naming the URL); a 400 -> InvalidRequest,
UnknownSamplingParameter or ContextLengthExceeded carrying the server's message; anything that does not
parse as SGLang's wire format -> BackendProtocolError naming what was wrong. An abort finish is a result
(FinishReason.ABORT, partial output), not an exception.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from polar.backends.base import (
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    LogprobSemantics,
    VersionSpan,
    WeightUpdate,
)
from polar.errors import (
    BackendError,
    BackendProtocolError,
    BackendUnavailable,
    ContextLengthExceeded,
    InvalidRequest,
    PolarError,
    UnknownSamplingParameter,
)

logger = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "retract", "in_place")
# Keys under which servers report the context window, in order of preference (/model_info, then /v1/models).
_CONTEXT_KEYS = ("max_context_length", "context_length", "max_model_len")
_UNKNOWN_PARAM = re.compile(r"unknown (?:sampling parameter|field)\s+'?([A-Za-z_][\w.]*)'?")
_CONTEXT_MESSAGE = re.compile(r"context (?:length|window)", re.IGNORECASE)
_NUMBER = re.compile(r"\d+")


class SGLangBackend:
    """A Backend over an SGLang server (or ``polar serve-model``) at ``base_url``."""

    name = "sglang"

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        model_info: Mapping[str, Any] | None = None,
        extra_sampling_params: Mapping[str, Any] | None = None,
        client: httpx.AsyncClient | None = None,
    ):
        """``model_info`` is ``/model_info`` as fetched by :meth:`connect`; ``extra_sampling_params`` are
        server-specific sampling keys sent as is with every request (e.g. ``{"no_stop_trim": True}``)."""
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.model_info: dict[str, Any] = dict(model_info or {})
        self.extra_sampling_params = dict(extra_sampling_params or {})
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self._client = client or httpx.AsyncClient(timeout=timeout)

    @classmethod
    async def connect(cls, base_url: str, *, timeout_s: float = 600.0, **kw: Any) -> SGLangBackend:
        """Build a backend and read the server's model info (and so its context length) once."""
        backend = cls(base_url, timeout_s=timeout_s, **kw)
        try:
            backend.model_info = await backend.fetch_model_info()
            if _context_length(backend.model_info) is None:
                models = await backend._get_json("/v1/models")
                data = models.get("data") if isinstance(models, dict) else None
                if isinstance(data, list) and data and isinstance(data[0], dict):
                    backend.model_info.setdefault("max_model_len", data[0].get("max_model_len"))
            _ = backend.context_length  # fail now, not at first use, if the server never says
        except BaseException:
            await backend.aclose()
            raise
        return backend

    @property
    def context_length(self) -> int:
        value = _context_length(self.model_info)
        if value is None:
            raise BackendProtocolError(
                f"{self.base_url} did not report a context length (looked for {', '.join(_CONTEXT_KEYS)} in "
                "/model_info and /v1/models); build the backend with SGLangBackend.connect()"
            )
        return value

    # ---- generation -------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        body = self._body(request, stream=False)
        url = self.base_url + "/generate"
        try:
            response = await self._send("POST", "/generate", json=body, request=request)
        except asyncio.CancelledError:
            # The server keeps generating for a request nobody waits for: free its slot (best effort).
            await self._abort_quietly(body["rid"])
            raise
        payload = _json_of(response, url)
        reader = _OutputReader(url, request)
        reader.add(payload)
        return reader.result(payload)

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Yield new tokens as the server streams them; the last chunk carries the result.

        Closing the iterator closes the connection, which makes the server abort the request.
        """
        body = self._body(request, stream=True)
        url = self.base_url + "/generate"
        reader = _OutputReader(url, request)
        started = time.perf_counter()
        last: GenerateChunk | None = None
        try:
            async with self._client.stream("POST", url, json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise _http_error(response, url, request, self)
                async for payload in _sse_payloads(response, url):
                    if "error" in payload:
                        raise _error_from_body(payload, 400, url, request, self, in_stream=True)
                    new_ids, new_logprobs = reader.add(payload)
                    if new_ids and reader.ttft_s is None:
                        reader.ttft_s = time.perf_counter() - started
                    meta = payload.get("meta_info") or {}
                    if meta.get("finish_reason") is not None:
                        # Held until the body is read to its end (data: [DONE]), so httpx can reuse the
                        # connection: a consumer that stops at the final chunk would make it discard it.
                        last = GenerateChunk(new_ids, new_logprobs, final=reader.result(payload))
                        continue
                    if new_ids:
                        yield GenerateChunk(new_ids, new_logprobs)
                if last is not None:
                    yield last
                    return
        except httpx.TransportError as exc:
            raise _unavailable(exc, url, self.timeout_s) from exc
        raise BackendProtocolError(f"{url}: the stream ended before a chunk with a finish_reason")

    def _body(self, request: GenerateRequest, *, stream: bool) -> dict[str, Any]:
        return {
            "input_ids": list(request.input_ids),
            "sampling_params": {**sampling_params_json(request), **self.extra_sampling_params},
            "return_logprob": True,
            "rid": request.request_id or uuid.uuid4().hex,
            "stream": stream,
        }

    # ---- weights and control ----------------------------------------------------------------------

    async def fetch_model_info(self) -> dict[str, Any]:
        info = await self._get_json("/model_info")
        if not isinstance(info, dict):
            raise BackendProtocolError(f"{self.base_url}/model_info did not answer a JSON object")
        return info

    async def weight_version(self) -> str:
        info = await self.fetch_model_info()
        version = info.get("weight_version")
        if not isinstance(version, str):
            raise BackendProtocolError(f"{self.base_url}/model_info has no string weight_version")
        return version

    async def update_weights_from_disk(
        self, path: Path | str, version: str | None, *, abort_all_requests: bool = False, flush_cache: bool = True
    ) -> dict[str, Any]:
        """Reload weights from a checkpoint folder on the server's disk and label them ``version``."""
        body = {
            "model_path": str(path),
            "weight_version": version,
            "abort_all_requests": abort_all_requests,
            "flush_cache": flush_cache,
        }
        return await self._control("/update_weights_from_disk", body)

    async def update_weight_version(self, version: str, *, abort_all_requests: bool = True) -> dict[str, Any]:
        """Relabel the live weights (SGLang aborts running requests unless told not to)."""
        return await self._control(
            "/update_weight_version", {"new_version": version, "abort_all_requests": abort_all_requests}
        )

    async def update_weights(self, update: WeightUpdate) -> None:
        """SGLang's refit: pause in place, load from disk (or relabel), continue. Running requests resume under
        the new weights and carry version spans."""
        if update.tensors is not None:
            raise InvalidRequest(
                "the sglang backend loads weights from a checkpoint path, not tensors", field="checkpoint_path"
            )
        await self.pause("in_place")
        try:
            if update.path:
                await self.update_weights_from_disk(update.path, update.version)
            else:
                await self.update_weight_version(update.version, abort_all_requests=False)
        finally:
            await self.resume()

    async def pause(self, mode: str = "abort") -> None:
        """``/pause_generation``: ``abort`` ends running requests, ``in_place``/``retract`` freeze them."""
        if mode not in PAUSE_MODES:
            raise InvalidRequest(f"pause mode must be one of {', '.join(PAUSE_MODES)}, not {mode!r}", field="mode")
        await self._control("/pause_generation", {"mode": str(mode)})

    async def resume(self) -> None:
        await self._control("/continue_generation", {})

    async def abort(self, rid: str | None = None) -> None:
        """Abort one request by rid, or every request when ``rid`` is None."""
        await self._send("POST", "/abort_request", json={"rid": rid or "", "abort_all": rid is None})

    async def aclose(self) -> None:
        await self._client.aclose()

    # ---- HTTP plumbing ----------------------------------------------------------------------------

    async def _control(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a control request; ``success: false`` replies become errors carrying the server's message."""
        url = self.base_url + path
        try:
            response = await self._client.post(url, json=body)
        except httpx.TransportError as exc:
            raise _unavailable(exc, url, self.timeout_s) from exc
        payload = _json_of(response, url, allow_error=True)
        if response.status_code >= 400 or (isinstance(payload, dict) and payload.get("success") is False):
            message = _message_of(payload) or response.text[:300]
            error = InvalidRequest if response.status_code < 500 else BackendError
            raise error(f"{url} refused: {message}")
        if not isinstance(payload, dict):
            raise BackendProtocolError(f"{url} did not answer a JSON object")
        return payload

    async def _get_json(self, path: str) -> Any:
        url = self.base_url + path
        return _json_of(await self._send("GET", path), url)

    async def _send(
        self, method: str, path: str, *, request: GenerateRequest | None = None, **kw: Any
    ) -> httpx.Response:
        url = self.base_url + path
        try:
            response = await self._client.request(method, url, **kw)
        except httpx.TransportError as exc:
            raise _unavailable(exc, url, self.timeout_s) from exc
        if response.status_code >= 400:
            raise _http_error(response, url, request, self)
        return response

    async def _abort_quietly(self, rid: str) -> None:
        with suppress(PolarError, asyncio.TimeoutError):
            await asyncio.shield(asyncio.wait_for(self.abort(rid), 5.0))


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
class _OutputReader:
    """Accumulates a response or a stream of cumulative or incremental chunks, checking every field."""

    url: str
    request: GenerateRequest
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ttft_s: float | None = None

    def add(self, payload: Any) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Take one response/chunk; return the ids and logprobs it adds."""
        if not isinstance(payload, dict):
            raise BackendProtocolError(f"{self.url}: expected a JSON object, got {type(payload).__name__}")
        meta = payload.get("meta_info")
        if not isinstance(meta, dict):
            raise BackendProtocolError(f"{self.url}: the response has no meta_info object")
        ids = _int_list(payload.get("output_ids"), "output_ids", self.url)
        triples = meta.get("output_token_logprobs")
        if not isinstance(triples, list):
            raise BackendProtocolError(f"{self.url}: meta_info.output_token_logprobs is missing (return_logprob)")
        if len(triples) != len(ids):
            raise BackendProtocolError(f"{self.url}: {len(triples)} output_token_logprobs for {len(ids)} output_ids")
        logprobs = _logprobs_of(triples, ids, self.url)
        total = meta.get("completion_tokens")
        if not isinstance(total, int):
            raise BackendProtocolError(f"{self.url}: meta_info.completion_tokens is missing")
        seen = len(self.ids)
        if len(ids) == total:  # cumulative (or the first chunk, where both readings agree)
            if ids[:seen] != self.ids:
                raise BackendProtocolError(f"{self.url}: a cumulative chunk rewrote output ids already streamed")
            new_ids, new_logprobs = ids[seen:], logprobs[seen:]
        elif seen + len(ids) == total:  # incremental
            new_ids, new_logprobs = ids, logprobs
        else:
            raise BackendProtocolError(
                f"{self.url}: a chunk with {len(ids)} output_ids and completion_tokens={total} fits neither "
                f"cumulative nor incremental streaming after {seen} tokens"
            )
        self.ids.extend(new_ids)
        self.logprobs.extend(new_logprobs)
        return tuple(new_ids), tuple(new_logprobs)

    def result(self, payload: dict[str, Any]) -> GenerateResult:
        meta = payload["meta_info"]
        reason, matched = _finish_of(meta.get("finish_reason"), self.url)
        prompt_tokens = meta.get("prompt_tokens")
        if not isinstance(prompt_tokens, int):
            raise BackendProtocolError(f"{self.url}: meta_info.prompt_tokens is missing")
        latency = meta.get("e2e_latency")
        return GenerateResult(
            output_ids=tuple(self.ids),
            output_logprobs=tuple(self.logprobs),
            finish_reason=reason,
            matched_stop=matched,
            version_spans=_spans_of(meta, len(self.ids), self.url),
            prompt_tokens=prompt_tokens,
            logprob_semantics=LogprobSemantics.TEMPERATURE_SCALED,
            ttft_s=self.ttft_s,
            e2e_s=float(latency) if isinstance(latency, int | float) else None,
        )


def _int_list(value: Any, name: str, url: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise BackendProtocolError(f"{url}: {name} is missing or not a list of integers")
    return value


def _logprobs_of(triples: list[Any], ids: list[int], url: str) -> list[float]:
    logprobs = []
    for i, (triple, token) in enumerate(zip(triples, ids, strict=True)):
        if not (isinstance(triple, list) and len(triple) >= 2 and isinstance(triple[0], int | float)):
            raise BackendProtocolError(f"{url}: output_token_logprobs[{i}] is not a [logprob, id, text] triple")
        if triple[1] != token:
            raise BackendProtocolError(
                f"{url}: output_token_logprobs[{i}] is for token {triple[1]} but output_ids[{i}] is {token}"
            )
        logprobs.append(float(triple[0]))
    return logprobs


def _finish_of(value: Any, url: str) -> tuple[FinishReason, int | str | None]:
    if not isinstance(value, dict) or value.get("type") not in ("stop", "length", "abort"):
        raise BackendProtocolError(f"{url}: finish_reason {value!r} is not a stop/length/abort dict")
    reason = FinishReason(value["type"])
    matched = value.get("matched") if reason is FinishReason.STOP else None
    if matched is not None and not isinstance(matched, int | str):
        raise BackendProtocolError(f"{url}: finish_reason.matched {matched!r} is neither a token id nor a string")
    return reason, matched


def _spans_of(meta: dict[str, Any], n_output: int, url: str) -> tuple[VersionSpan, ...]:
    raw = meta.get("weight_versions")
    if raw is None:
        version = meta.get("weight_version")
        if not isinstance(version, str):
            raise BackendProtocolError(f"{url}: meta_info has neither weight_versions nor weight_version")
        return (VersionSpan(version, 0, n_output),)
    try:
        spans = tuple(VersionSpan(str(s["version"]), int(s["start"]), int(s["end"])) for s in raw)
    except (TypeError, KeyError, ValueError):
        raise BackendProtocolError(
            f"{url}: meta_info.weight_versions is not a list of {{version, start, end}}"
        ) from None
    contiguous = all(a.end == b.start for a, b in zip(spans, spans[1:], strict=False))
    if not spans or spans[0].start != 0 or spans[-1].end != n_output or not contiguous:
        raise BackendProtocolError(f"{url}: weight_versions {raw!r} do not cover the {n_output} output tokens")
    return spans


async def _sse_payloads(response: httpx.Response, url: str) -> AsyncIterator[Any]:
    """The JSON objects of ``data:`` events, up to ``data: [DONE]``.

    A server that ignored ``stream`` and answered one JSON body yields that body as the only payload.
    """
    if response.headers.get("content-type", "").startswith("application/json"):
        await response.aread()
        yield _json_of(response, url)
        return
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            if line and not line.startswith((":", "event:", "id:", "retry:")):
                raise BackendProtocolError(f"{url}: not a server-sent event line: {line[:200]!r}")
            continue  # blank separators, comments, named-event fields
        data = line[5:].strip()
        if data == "[DONE]":
            continue  # read on to the end of the body: the connection can then be reused
        try:
            yield json.loads(data)
        except json.JSONDecodeError:
            raise BackendProtocolError(f"{url}: a stream event is not JSON: {data[:200]!r}") from None


def _json_of(response: httpx.Response, url: str, *, allow_error: bool = False) -> Any:
    if response.status_code >= 400 and not allow_error:
        raise BackendProtocolError(f"{url} answered HTTP {response.status_code}")
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BackendProtocolError(f"{url} did not answer JSON: {response.text[:200]!r}") from None


def _message_of(payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    for key in ("message", "detail", "error"):
        if isinstance(payload.get(key), str):
            return payload[key]
    return None


def _http_error(
    response: httpx.Response, url: str, request: GenerateRequest | None, backend: SGLangBackend
) -> PolarError:
    try:
        payload = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        payload = None
    if _message_of(payload) is None:
        payload = {"error": {"message": response.text[:300] or response.reason_phrase}}
    return _error_from_body(payload, response.status_code, url, request, backend)


def _error_from_body(
    payload: dict[str, Any],
    status: int,
    url: str,
    request: GenerateRequest | None,
    backend: SGLangBackend,
    *,
    in_stream: bool = False,
) -> PolarError:
    """Map an SGLang error body to polar's errors, keeping the server's message."""
    message = _message_of(payload) or "no message"
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
            window = _context_length(backend.model_info) or (max(numbers) if numbers else 0)
            exc = ContextLengthExceeded(prompt, window)
            exc.message, exc.args = message, (message,)
            return exc
        return InvalidRequest(message)
    if status in (408, 429, 503):
        return BackendUnavailable(f"{url} answered {status}: {message}")
    if status == 404:
        return BackendProtocolError(f"{url} answered 404 (is this an SGLang server?): {message}")
    return BackendError(f"{url} answered {status}: {message}")


def _unavailable(exc: httpx.TransportError, url: str, timeout_s: float) -> BackendUnavailable:
    if isinstance(exc, httpx.TimeoutException):
        return BackendUnavailable(f"{url} timed out (limit {timeout_s:g} s): {type(exc).__name__}")
    return BackendUnavailable(f"cannot reach {url}: {type(exc).__name__}: {exc}")


def _context_length(info: Mapping[str, Any]) -> int | None:
    for key in _CONTEXT_KEYS:
        value = info.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
