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
import time
import uuid
from array import array
from collections.abc import AsyncIterator, Mapping
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from polar.backends import http1
from polar.backends.extras import ExtrasReader, loads_without_experts, sglang_request_fields
from polar.backends.http1 import TRANSPORT_ERRORS
from polar.backends.sglang_wire import (
    CONTEXT_KEYS,
    OutputReader,
    context_length_of,
    error_from_body,
    http_error,
    json_of,
    message_of,
    sampling_params_json,
    sse_batches,
    unavailable,
)
from polar.errors import (
    BackendError,
    BackendProtocolError,
    InvalidRequest,
    PolarError,
)
from polar.inference import (
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    WeightUpdate,
)
from polar.models.moe_shape import MoEShape
from polar.tokens.ids_json import ids_text

PAUSE_MODES = ("abort", "retract", "in_place")


def _json(body: dict[str, Any]) -> bytes:
    """A generation request body: orjson, one C call for thousands of prompt ids (httpx's ``json=`` is the
    standard encoder, several milliseconds for a long prompt); the standard encoder for what orjson refuses.
    Copied to its length: orjson's bytes keep the buffer they were written in (1 MB for the 19 KB of a 4,000-id
    prompt), and a body is held while its call runs: a thousand first calls held a gigabyte of the heap."""
    try:
        return bytes(memoryview(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)))
    except TypeError:
        return json.dumps(body, default=lambda ids: ids.tolist()).encode()


IDS_SLICE = 32_768
"""Prompt ids serialised per slice of this many (about 0.3 ms of orjson each), the event loop free between slices."""


async def _body_json(body: dict[str, Any], ids_json: tuple[bytes, ...] | None = None) -> bytes:
    """``_json(body)``: with the prompt's JSON given in parts (``GenerateRequest.input_ids_json``: a session's
    earlier turns encoded already), those parts joined once with the rest; else a long prompt in slices: orjson
    holds the GIL for the whole call, so a 400k-id prompt serialised at once (~4 ms, and as long again to copy) held
    every other session's calls; sliced, the loop runs between slices and the parts are joined once into a body of
    exactly its length. The same bytes as ``_json``: ``input_ids`` is the body's first key (``SGLangBackend._body``)."""
    ids = body["input_ids"]
    if ids_json is None and (not isinstance(ids, np.ndarray) or len(ids) <= IDS_SLICE):
        return _json(body)
    head, tail = _json({**body, "input_ids": []}).split(b'"input_ids":[]', 1)
    if ids_json is not None:
        return b"".join((head, b'"input_ids":', *ids_json, tail))
    parts = [head, b'"input_ids":[']
    for start in range(0, len(ids), IDS_SLICE):
        if start:
            parts.append(b",")
            await asyncio.sleep(0)
        parts.append(ids_text(ids[start : start + IDS_SLICE]))
    parts += [b"]", tail]
    return b"".join(parts)


def _ids_json(ids: Any) -> Any:
    """Prompt ids as ``_json`` encodes them fastest: an int32 array read in place by numpy (no object per id), a
    tuple or list as it is."""
    if isinstance(ids, array) and ids.typecode == "i":
        return np.frombuffer(ids, dtype=np.int32)
    return ids if isinstance(ids, list | tuple) else list(ids)


def _parse_with_experts(response: Any, url: str) -> Any:
    """The body with its routed experts cut out before parsing (polar.backends.extras.loads_without_experts)."""
    try:
        return loads_without_experts(response.content)
    except orjson.JSONDecodeError:
        return json_of(response, url)  # the usual path names what is wrong


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
        routing_shape: MoEShape | None = None,
    ):
        """``model_info`` is ``/model_info`` as fetched by :meth:`connect`; ``extra_sampling_params`` are
        server-specific sampling keys sent as is with every request (e.g. ``{"no_stop_trim": True}``);
        ``routing_shape`` is the served MoE model's (from its folder's config.json), which SGLang's flat
        ``routed_experts`` needs to be read."""
        self.routing_shape = routing_shape
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.model_info: dict[str, Any] = dict(model_info or {})
        self.extra_sampling_params = dict(extra_sampling_params or {})
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self._client = client or httpx.AsyncClient(timeout=timeout)  # control calls
        self._aio = http1.Client(timeout_s)  # generation: polar.backends.http1 says why

    @classmethod
    async def connect(cls, base_url: str, *, timeout_s: float = 600.0, **kw: Any) -> SGLangBackend:
        """Build a backend and read the server's model info (and so its context length) once."""
        backend = cls(base_url, timeout_s=timeout_s, **kw)
        try:
            backend.model_info = await backend.fetch_model_info()
            if context_length_of(backend.model_info) is None:
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
        value = context_length_of(self.model_info)
        if value is None:
            raise BackendProtocolError(
                f"{self.base_url} did not report a context length (looked for {', '.join(CONTEXT_KEYS)} in "
                "/model_info and /v1/models); build the backend with SGLangBackend.connect()"
            )
        return value

    # ---- generation -------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        body = self._body(request, stream=False)
        url = self.base_url + "/generate"
        try:
            async with self._aio.post(url, await _body_json(body, request.input_ids_json)) as response:
                await response.aread()
        except asyncio.CancelledError:
            # The server keeps generating for a request nobody waits for: free its slot (best effort).
            await self._abort_quietly(body["rid"])
            raise
        except TRANSPORT_ERRORS as exc:
            raise unavailable(exc, url, self.timeout_s) from exc
        if response.status_code >= 400:
            raise http_error(response, url, request, self.model_info)
        if request.extras is not None and request.extras.routed_experts and response.status_code < 400:
            payload = _parse_with_experts(response, url)
        else:
            payload = json_of(response, url)
        reader = OutputReader(url, request)
        extras = ExtrasReader(url, request, self.routing_shape)
        extras.add(payload, len(reader.add(payload)[0]))
        return self._with_extras(reader.result(payload), extras, payload)

    @staticmethod
    def _with_extras(result: GenerateResult, extras: ExtrasReader, payload: dict[str, Any]) -> GenerateResult:
        if extras.request.extras is None:
            return result
        return replace(result, extras=extras.result(payload, len(result.output_ids)))

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Yield new tokens as the server streams them; the last chunk carries the result.

        Closing the iterator closes the connection, which makes the server abort the request.
        """
        body = self._body(request, stream=True)
        url = self.base_url + "/generate"
        reader = OutputReader(url, request)
        extras = ExtrasReader(url, request, self.routing_shape)
        started = time.perf_counter()
        last: GenerateChunk | None = None
        try:
            async with self._aio.post(url, await _body_json(body, request.input_ids_json)) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise http_error(response, url, request, self.model_info)
                async for payloads in sse_batches(response, url):
                    if last is not None:
                        raise BackendProtocolError(f"{url}: the stream went on after its final chunk")
                    new_ids, new_logprobs, final = self._read_batch(payloads, reader, started, extras)
                    del payloads  # parsed events are not held across a yield (each logprob triple is a list)
                    if final is not None:
                        # Held until the body is read to its end (data: [DONE]), so the connection can be
                        # reused: a consumer that stops at the final chunk would make the client discard it.
                        last = GenerateChunk(tuple(new_ids), tuple(new_logprobs), final=final)
                    elif new_ids:
                        yield GenerateChunk(tuple(new_ids), tuple(new_logprobs))
                if last is not None:
                    yield last
                    return
        except TRANSPORT_ERRORS as exc:
            raise unavailable(exc, url, self.timeout_s) from exc
        raise BackendProtocolError(f"{url}: the stream ended before a chunk with a finish_reason")

    def _read_batch(
        self, payloads: list[Any], reader: OutputReader, started: float, extras: ExtrasReader
    ) -> tuple[list[int], list[float], GenerateResult | None]:
        """The ids and logprobs that events read together add, and the result when one of them is the final chunk
        (a finish_reason). The parsed events end with this call: with a thousand streams open, holding each
        stream's latest cumulative chunk kept ~20,000 lists alive, and every young collection walked them."""
        new_ids: list[int] = []
        new_logprobs: list[float] = []
        finished: dict[str, Any] | None = None
        for payload in payloads:
            if not isinstance(payload, dict):
                raise BackendProtocolError(f"{reader.url}: a stream event is {payload!r:.100}, not a JSON object")
            if finished is not None:
                raise BackendProtocolError(f"{reader.url}: the stream went on after its final chunk")
            if "error" in payload:
                raise error_from_body(payload, 400, reader.url, reader.request, self.model_info, in_stream=True)
            ids, logprobs = reader.add(payload)
            extras.add(payload, len(ids))
            new_ids += ids
            new_logprobs += logprobs
            if (payload.get("meta_info") or {}).get("finish_reason") is not None:
                finished = payload
        if new_ids and reader.ttft_s is None:
            reader.ttft_s = time.perf_counter() - started
        if finished is None:
            return new_ids, new_logprobs, None
        return new_ids, new_logprobs, self._with_extras(reader.result(finished), extras, finished)

    def _body(self, request: GenerateRequest, *, stream: bool) -> dict[str, Any]:
        return {
            # Given as JSON text already (a session's line), the ids are never read here: ``_body_json`` joins it.
            "input_ids": _ids_json(request.input_ids) if request.input_ids_json is None else [],
            "sampling_params": {**sampling_params_json(request), **self.extra_sampling_params},
            "return_logprob": True,
            "rid": request.request_id or uuid.uuid4().hex,
            "stream": stream,
            **sglang_request_fields(request.extras),
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
        await self._aio.aclose()
        await self._client.aclose()

    # ---- HTTP plumbing ----------------------------------------------------------------------------

    async def _control(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a control request; ``success: false`` replies become errors carrying the server's message."""
        url = self.base_url + path
        try:
            response = await self._client.post(url, json=body)
        except httpx.TransportError as exc:
            raise unavailable(exc, url, self.timeout_s) from exc
        payload = json_of(response, url, allow_error=True)
        if response.status_code >= 400 or (isinstance(payload, dict) and payload.get("success") is False):
            message = message_of(payload) or response.text[:300]
            error = InvalidRequest if response.status_code < 500 else BackendError
            raise error(f"{url} refused: {message}")
        if not isinstance(payload, dict):
            raise BackendProtocolError(f"{url} did not answer a JSON object")
        return payload

    async def _get_json(self, path: str) -> Any:
        url = self.base_url + path
        return json_of(await self._send("GET", path), url)

    async def _send(
        self, method: str, path: str, *, request: GenerateRequest | None = None, **kw: Any
    ) -> httpx.Response:
        url = self.base_url + path
        try:
            response = await self._client.request(method, url, **kw)
        except httpx.TransportError as exc:
            raise unavailable(exc, url, self.timeout_s) from exc
        if response.status_code >= 400:
            raise http_error(response, url, request, self.model_info)
        return response

    async def _abort_quietly(self, rid: str) -> None:
        with suppress(PolarError, asyncio.TimeoutError):
            await asyncio.shield(asyncio.wait_for(self.abort(rid), 5.0))
