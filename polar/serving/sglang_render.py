"""SGLang's native response JSON, built from engine output (pure functions).

The shapes follow ``TokenizerManager._handle_batch_output`` and ``schedule_batch`` finish reasons:

- ``output_ids`` are the sampled ids untouched, the matched stop token included (it has a logprob);
- ``text`` is decoded with ``skip_special_tokens`` (default True) and trimmed like
  ``DetokenizerManager.trim_matched_stop``: a matched stop *token* is dropped before decoding and a matched
  stop *string* cuts the text where it starts, unless ``no_stop_trim``;
- ``meta_info.output_token_logprobs`` is ``[[logprob, token_id, text | null], ...]``, text only with
  ``return_text_in_logprobs``; ``output_token_logprobs_length`` is always the cumulative count;
- finish reasons are ``{"type": "stop", "matched": id | str}``, ``{"type": "length", "length": N}`` or
  ``{"type": "abort", "message", "status_code", "err_type"}``, and ``null`` while unfinished.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polar.errors import PolarError
from polar.inference import FinishReason, VersionSpan
from polar.serving.sglang_wire import OutputOptions
from polar.tokens.tokenizer import ChatTokenizer

# While a generation is running, a trailing replacement character is usually half of a multi-byte
# character whose other bytes have not been sampled yet; SGLang's detokenizer holds such text back too.
_INCOMPLETE = "\ufffd"


def finish_reason_json(
    reason: FinishReason, matched: int | str | None, *, max_new_tokens: int, abort_message: str
) -> dict[str, Any]:
    if reason is FinishReason.STOP:
        return {"type": "stop", "matched": matched}
    if reason is FinishReason.LENGTH:
        return {"type": "length", "length": max_new_tokens}
    return {"type": "abort", "message": abort_message, "status_code": None, "err_type": None}


def output_text(
    tokenizer: ChatTokenizer,
    ids: Sequence[int],
    options: OutputOptions,
    *,
    finished: bool,
    matched: int | str | None = None,
) -> str:
    """The text SGLang reports for ``ids`` so far (trimmed of the matched stop once finished)."""
    trim = finished and not options.no_stop_trim
    if trim and isinstance(matched, int) and ids and ids[-1] == matched:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=options.skip_special_tokens)
    if trim and isinstance(matched, str):
        pos = text.find(matched)
        text = text[:pos] if pos != -1 else text
    if not finished:
        text = text.rstrip(_INCOMPLETE)
    return text


def logprob_triples(
    tokenizer: ChatTokenizer, ids: Sequence[int], logprobs: Sequence[float], *, with_text: bool
) -> list[list[Any]]:
    """``[[logprob, token_id, text | null], ...]``; the text is each token decoded on its own."""
    return [[lp, tid, tokenizer.decode([tid]) if with_text else None] for lp, tid in zip(logprobs, ids, strict=True)]


def spans_json(spans: Sequence[VersionSpan]) -> list[dict[str, Any]]:
    return [{"version": s.version, "start": s.start, "end": s.end} for s in spans]


def meta_info(
    *,
    rid: str,
    finish_reason: dict[str, Any] | None,
    prompt_tokens: int,
    completion_tokens: int,
    spans: Sequence[VersionSpan],
    e2e_latency: float,
    logprobs: list[list[Any]] | None,
) -> dict[str, Any]:
    """``meta_info``; ``logprobs`` (possibly an incremental slice) only when return_logprob was asked."""
    info: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": 0,  # the engine reuses prefixes but does not report how many tokens per request
        "reasoning_tokens": 0,
        "weight_version": spans[-1].version,
        "weight_versions": spans_json(spans),
        "e2e_latency": e2e_latency,
    }
    if logprobs is not None:
        info["output_token_logprobs"] = logprobs
        info["output_token_logprobs_length"] = completion_tokens
    return info


def error_json(exc: PolarError) -> dict[str, Any]:
    """The body of an error answered before any output: ``{"error": {message, type, code}}``."""
    return {"error": {"message": exc.message, "type": exc.error_type, "code": exc.status_code}}


def stream_error_json(exc: PolarError) -> dict[str, Any]:
    """An error in the middle of a stream, as SGLang sends it in a ``data:`` event."""
    body = error_json(exc)
    body["error"]["retryable"] = exc.status_code in (429, 503)
    return body
