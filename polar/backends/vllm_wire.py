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

from polar.errors import (
    BackendError,
    BackendProtocolError,
    BackendUnavailable,
    ConfigError,
    ContextLengthExceeded,
    InvalidRequest,
)
from polar.inference import ExtrasRequest, GenerateExtras, SamplingParams, VersionSpan

logger = logging.getLogger(__name__)

# vLLM's parameter names in error messages → Polar's (SGLang) names.
_FIELD_NAMES = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "token_ids": "input_ids",
    "prompt": "input_ids",
    "input_tokens": "input_ids",
}
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
    # Top-k logprobs per sampled token, when asked (``top_k`` > 0): ids and values, ranks 1..k in order.
    top_k: int = 0
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)

    def extras(self) -> GenerateExtras | None:
        if not self.top_k:
            return None
        shape = (len(self.top_ids), self.top_k)
        return GenerateExtras(
            top_ids=np.asarray(self.top_ids, dtype=np.int32).reshape(shape),
            top_logprobs=np.asarray(self.top_logprobs, dtype=np.float32).reshape(shape),
        )


def logprobs_to_ask(extras: ExtrasRequest | None, endpoint: str) -> int:
    """``sampling_params.logprobs`` for a generate-wire request: 0 (the sampled token's logprob only) or, with
    top-k asked, k + 1. vLLM lists the sampled token first and then candidates in rank order, cut to the count
    asked, so with k + 1 asked ranks 1..k are always in the list whether or not the sampled token is among them.
    Extras vLLM cannot give here are refused (``ConfigError``), never returned empty."""
    if extras is None or not extras.any:
        return 0
    if extras.routed_experts or extras.token_ids:
        raise ConfigError("routed experts and chosen-id logprobs are not read from vLLM; use SGLang for them")
    if endpoint != "generate":
        raise ConfigError("top-k logprobs are read from vLLM's generate endpoint only (POLAR_VLLM_ENDPOINT=generate)")
    return extras.top_logprobs + 1


def top_k_row(entry: Any, k: int) -> tuple[list[int], list[float]]:
    """Ranks 1..k of one position's ``top_logprobs`` (``[{token_id, logprob, rank}]``), in rank order."""
    ranked: dict[int, tuple[int, float]] = {}
    for candidate in field_of(entry, "top_logprobs", list):
        rank = field_of(candidate, "rank", int, nullable=True)
        if rank is not None and 1 <= rank <= k:
            ranked[rank] = (token_id_of(candidate.get("token_id")), field_of(candidate, "logprob", float))
    if sorted(ranked) != list(range(1, k + 1)):
        raise BackendProtocolError(f"vLLM top_logprobs hold ranks {sorted(ranked)}, expected 1..{k}")
    return [ranked[r][0] for r in range(1, k + 1)], [ranked[r][1] for r in range(1, k + 1)]


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
