"""One ``/generate`` request running on the engine, rendered as SGLang response dicts.

The engine yields one chunk per sampled token and a final chunk carrying the result. A run turns that
into SGLang's wire objects: a single response (non-stream), or one chunk every ``stream_interval``
tokens plus a final chunk (stream). Stream chunks are cumulative by default (the full text, ids and
logprobs so far) or incremental (deltas, with the output-side logprob list sliced the same way), as
SGLang's ``--incremental-streaming-output`` does; ``completion_tokens`` and
``output_token_logprobs_length`` stay cumulative in both.

Closing a run's iterator (a client disconnect) closes the engine stream, which removes the job from the
engine. ``abort`` ends a run at its next token with an abort finish reason and the partial output, as
SGLang's ``/abort_request`` does for one rid.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, cast

import numpy as np

from polar.errors import PolarError
from polar.inference import FinishReason, GenerateChunk, GenerateResult, VersionSpan
from polar.models.engine import LocalEngine
from polar.serving.sglang_extras import routed_experts_b64, triples_of
from polar.serving.sglang_render import finish_reason_json, logprob_triples, meta_info, output_text
from polar.serving.sglang_wire import PreparedGenerate


class GenerationRun:
    """Drives one prepared request through the engine; iterate ``chunks()`` or await ``response()``."""

    def __init__(
        self,
        engine: LocalEngine,
        prepared: PreparedGenerate,
        *,
        incremental: bool = False,
        abort_message: Callable[[], str] = lambda: "Aborted.",
    ):
        self.engine = engine
        self.prepared = prepared
        self.incremental = incremental
        self._abort_message = abort_message  # asked when the engine reports an abort, for its reason
        self._aborted: str | None = None
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        # The label live when each token arrived. Only a preview for unfinished chunks: the engine's
        # own spans (exact to the decode step) replace it in the final chunk.
        self._seen_versions: list[str] = []
        self._triples: list[list[Any]] = []  # rendered once per token: cumulative chunks repeat them all
        self._top: list[list[Any]] = []  # output_top_logprobs, one entry per token (sglang_extras)
        self._chosen: list[list[Any]] = []  # output_token_ids_logprobs, one entry per token
        self._sent_ids = 0
        self._sent_text = ""
        self._started = time.perf_counter()

    @property
    def rid(self) -> str:
        return self.prepared.rid

    def abort(self, message: str) -> None:
        """End the run at its next token with an abort finish reason, keeping the partial output.

        The engine has no per-request abort, so the run stops reading and closes the engine stream
        itself; its spans are then the labels seen as tokens arrived. A run frozen by an in-place pause
        ends when generation continues.
        """
        self._aborted = message

    async def response(self) -> dict[str, Any]:
        """Generate to the end and return the whole (cumulative) response."""
        async for result in self._progress():
            if result is not None:
                return self._render(result, incremental=False)
        raise PolarError("the engine stream ended without a final result")

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """Stream chunks; the last one carries the finish reason."""
        interval = self.prepared.options.stream_interval
        pending = 0
        async for result in self._progress():
            pending += 1
            if result is None and pending < interval:
                continue
            pending = 0
            yield self._render(result, incremental=self.incremental)

    async def _progress(self) -> AsyncIterator[GenerateResult | None]:
        """None after each new token, then the final result.

        SGLang sends the last token and the finish reason in one chunk; the engine hands its result over
        as a separate chunk. When the newest token may have ended the request (SGLang's stop rules), the
        run waits for what the engine sends next before reporting the token, so both travel together.
        """
        # LocalEngine.stream is an async generator (typed as an iterator), so it can be closed.
        engine_stream = cast(AsyncGenerator[GenerateChunk, None], self.engine.stream(self.prepared.request))
        async with aclosing(engine_stream) as stream:
            upcoming: asyncio.Future[GenerateChunk | None] | None = None
            try:
                chunk = await _next(stream)
                while chunk is not None:
                    self._absorb(chunk)
                    if chunk.final is not None:
                        yield chunk.final
                        return
                    if self._aborted is not None:
                        yield self._aborted_result()
                        return
                    # The engine keeps decoding in its own task while the caller sends this chunk.
                    upcoming = asyncio.ensure_future(_next(stream))
                    if self._may_have_finished():
                        following = await upcoming
                        upcoming = None
                        if following is None or following.final is None:
                            yield None  # it had not finished after all: report the token on its own
                        chunk = following
                        continue
                    yield None
                    chunk, upcoming = await upcoming, None
            finally:
                if upcoming is not None and not upcoming.done():
                    # The stream cannot be closed while this task is inside it: cancel the task,
                    # which ends the engine stream (its job is dropped) from within.
                    upcoming.cancel()
                    await asyncio.gather(upcoming, return_exceptions=True)
        raise PolarError("the engine stream ended without a final result")

    def _may_have_finished(self) -> bool:
        """Whether the newest token meets a finish condition: length, a stop/EOS token or a stop string.

        A hint only: a false alarm delays one token by one decode step, a miss sends the finish reason
        in a chunk of its own.
        """
        params = self.prepared.request.sampling
        if len(self._ids) >= params.max_new_tokens:
            return True
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.engine.tokenizer.eos_ids))
        if self._ids[-1] in stop_ids:
            return True
        if params.stop:
            window = max(len(s.encode()) for s in params.stop) + 2  # no stop string spans more tokens
            tail = self.engine.tokenizer.decode(self._ids[-window:])
            return any(s in tail for s in params.stop)
        return False

    def _absorb(self, chunk: GenerateChunk) -> None:
        self._ids.extend(chunk.output_ids)
        self._logprobs.extend(chunk.output_logprobs)
        extras = chunk.extras
        if extras is not None:
            with_text = self.prepared.options.return_text_in_logprobs
            tokenizer = self.engine.tokenizer
            if extras.top_ids is not None:
                for ids, values in zip(extras.top_ids, extras.top_logprobs, strict=True):
                    self._top.append(triples_of(tokenizer, ids, values, with_text=with_text))
            if extras.token_ids_logprobs is not None:
                asked = np.asarray(self.prepared.request.extras.token_ids if self.prepared.request.extras else ())
                for values in extras.token_ids_logprobs:
                    self._chosen.append(triples_of(tokenizer, asked, values, with_text=with_text))
        self._seen_versions.extend([self.engine.weight_version] * len(chunk.output_ids))

    def _aborted_result(self) -> GenerateResult:
        return GenerateResult(
            output_ids=tuple(self._ids),
            output_logprobs=tuple(self._logprobs),
            finish_reason=FinishReason.ABORT,
            matched_stop=None,
            version_spans=self._preview_spans(),
            prompt_tokens=len(self.prepared.request.input_ids),
            logprob_semantics=self.engine.semantics,
            e2e_s=time.perf_counter() - self._started,
        )

    def _preview_spans(self) -> tuple[VersionSpan, ...]:
        spans: list[VersionSpan] = []
        for i, version in enumerate(self._seen_versions):
            if spans and spans[-1].version == version:
                spans[-1] = VersionSpan(version, spans[-1].start, i + 1)
            else:
                spans.append(VersionSpan(version, i, i + 1))
        return tuple(spans) or (VersionSpan(self.engine.weight_version, 0, 0),)

    def _render(self, result: GenerateResult | None, *, incremental: bool) -> dict[str, Any]:
        prepared, options, tokenizer = self.prepared, self.prepared.options, self.engine.tokenizer
        finished = result is not None
        ids = list(result.output_ids) if result is not None else list(self._ids)
        logprobs = list(result.output_logprobs) if result is not None else list(self._logprobs)
        matched = result.matched_stop if result is not None else None
        text = output_text(tokenizer, ids, options, finished=finished, matched=matched)
        finish = None
        if result is not None:
            reason = self._aborted if self._aborted is not None else self._abort_message()
            finish = finish_reason_json(
                result.finish_reason, matched, max_new_tokens=prepared.max_new_tokens, abort_message=reason
            )
        start = self._sent_ids if incremental else 0
        triples = None
        if options.return_logprob:
            done = len(self._triples)
            with_text = options.return_text_in_logprobs
            self._triples += logprob_triples(tokenizer, ids[done:], logprobs[done:], with_text=with_text)
            triples = self._triples[start : len(ids)]
        out_text = text
        if incremental:
            # A delta cannot take back text already sent: if a stop-string trim shortened the text, the
            # delta is empty (clients that need exact output read output_ids).
            out_text = text[len(self._sent_text) :] if text.startswith(self._sent_text) else ""
            self._sent_text = text if text.startswith(self._sent_text) else self._sent_text
            self._sent_ids = len(ids)
        body: dict[str, Any] = {"text": out_text, "output_ids": ids[start:]}
        if options.return_prompt_token_ids:
            body["prompt_token_ids"] = list(prepared.request.input_ids)
        body["meta_info"] = meta_info(
            rid=prepared.rid,
            finish_reason=finish,
            prompt_tokens=len(prepared.request.input_ids),
            completion_tokens=len(ids),
            spans=result.version_spans if result is not None else self._preview_spans(),
            e2e_latency=time.perf_counter() - self._started,
            logprobs=triples,
        )
        self._render_extras(body["meta_info"], result, start, len(ids))
        return body

    def _render_extras(self, meta: dict[str, Any], result: GenerateResult | None, start: int, end: int) -> None:
        """The extras asked for, as SGLang names them: per-position lists sliced like the logprobs, routed
        experts in the finished response only."""
        asked = self.prepared.request.extras
        if asked is None:
            return
        if asked.top_logprobs:
            meta["output_top_logprobs"] = self._top[start:end]
        if asked.token_ids:
            meta["output_token_ids_logprobs"] = self._chosen[start:end]
        extras = result.extras if result is not None else None
        if asked.routed_experts and extras is not None and extras.routed_experts is not None:
            meta["routed_experts"] = routed_experts_b64(extras.routed_experts)


async def _next(stream: AsyncIterator[GenerateChunk]) -> GenerateChunk | None:
    """The next chunk, or None at the end of the stream."""
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None
