"""The streaming half of a model call (``CallService`` inherits it): frames as tokens arrive, the capture
committed before the final event, and every failure after the first frame ended with the protocol's error
event, never a cut stream. ``polar.proxy.service`` has the rest of a call.

Frames leave one chunk behind the backend: the last content goes out only after the commit, so a stream whose
commit fails never delivers its whole reply (the error event comes instead of its last content); a client that
leaves before the last frame makes its committed capture ``UNACKNOWLEDGED`` (``CallService.undelivered``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from polar import metrics
from polar.errors import BackendProtocolError, BackendTimeout, PolarError
from polar.inference import GenerateChunk, GenerateRequest, GenerateResult
from polar.proxy.output_check import OutputCheck
from polar.slices import turn
from polar.tokens.parsers import MalformedToolCall, collect
from polar.tokens.parsers.types import Event
from polar.wire.base import StreamEncoder

if TYPE_CHECKING:
    from polar.chat.protocol import ChatFormat
    from polar.proxy.service import CallPlan
    from polar.wire.canonical import Completion

log = logging.getLogger(__name__)


class StreamingCalls:
    """``open_stream`` and its frames; the parts of a call both halves use are ``CallService``'s."""

    chat_format: ChatFormat
    backend_deadline_s: float

    if TYPE_CHECKING:

        async def _slot(self, plan: CallPlan) -> Callable[[], None]: ...
        def _check(self, plan: CallPlan) -> OutputCheck: ...
        def _timeout(self) -> BackendTimeout: ...
        @staticmethod
        def _request(plan: CallPlan) -> GenerateRequest: ...
        def _completion(self, plan: CallPlan, final: GenerateResult, parsed: Any) -> Completion: ...
        async def _record(
            self, plan: CallPlan, final: GenerateResult, completion: Completion, response: dict[str, Any]
        ) -> int: ...
        def undelivered(self, plan: CallPlan, capture_id: int) -> None: ...
        async def _record_error(self, plan: CallPlan, error: PolarError) -> None: ...

    async def _next(self, chunks: AsyncIterator[GenerateChunk], deadline: Deadline) -> GenerateChunk | None:
        """The next chunk, or None at the end; ``BackendTimeout`` once the call's deadline has passed."""
        if deadline.passed:
            raise self._timeout()
        task = deadline.waiting = asyncio.current_task()
        try:
            return await anext(chunks, None)
        except asyncio.CancelledError:
            if deadline.passed and task is not None and task.uncancel() == 0:
                raise self._timeout() from None
            raise
        finally:
            deadline.waiting = None

    @staticmethod
    def _check_chunk(check: OutputCheck, chunk: GenerateChunk) -> None:
        check.chunk(chunk.output_ids, chunk.output_logprobs)
        if chunk.final is not None:
            check.result(chunk.final, streamed=True)

    async def open_stream(self, plan: CallPlan) -> tuple[AsyncIterator[str], Callable[[], None]]:
        """Start generating; errors before the first token raise here (a normal error response). Returns the
        frames and the release of the call's in-flight slot: the frames release it when the generation ends;
        the caller calls it too once the response is over (a stream whose client left before it started)."""
        slot = await self._slot(plan)
        generating = time.perf_counter()
        check = self._check(plan)
        deadline = Deadline(self.backend_deadline_s)

        def release() -> None:
            deadline.cancel()
            slot()

        chunks = plan.policy.stream(self._request(plan), plan.context)
        try:
            first = await self._next(chunks, deadline)
            if first is None:
                raise BackendProtocolError("the backend ended its stream without a result")
            self._check_chunk(check, first)
            metrics.TTFT.labels(plan.codec.name).observe(time.perf_counter() - plan.started)
        except PolarError as exc:
            await _aclose(chunks)
            release()
            await self._record_error(plan, exc)
            raise
        except BaseException:
            await _aclose(chunks)
            release()
            raise
        return self._frames(plan, first, chunks, check, deadline, release, generating), release

    async def _frames(
        self,
        plan: CallPlan,
        first: GenerateChunk,
        chunks: AsyncIterator[GenerateChunk],
        check: OutputCheck,
        deadline: Deadline,
        release: Callable[[], None],
        generating: float,
    ) -> AsyncIterator[str]:
        encoder = plan.codec.stream_encoder(plan.meta, request=plan.request)
        parser = self.chat_format.stream_parser(plan.request.tools, plan.prompt.ids)
        events: list[Event] = []
        final: GenerateResult | None = None
        recorded: int | None = None  # the capture's id once committed
        held = ""  # the last content: it leaves only after the commit, so a failed commit sends none of it
        if opening := "".join(encoder.start()):  # one write per step: a chunk's frames leave together
            yield opening
        try:
            chunk: GenerateChunk | None = first
            while chunk is not None:
                await turn()
                if chunk.output_ids and (frames := _encode(encoder, events, parser.feed(chunk.output_ids))):
                    # One chunk behind: a chunk's frames leave when the next one arrives, so the last content
                    # is still here when the commit fails, and the error event replaces it.
                    if held:
                        yield held
                    held = frames
                final = chunk.final or final
                chunk = await self._next(chunks, deadline)
                if chunk is not None:
                    self._check_chunk(check, chunk)
            release()  # the generation is over: the next call may use the server while this one commits
            generated_s = time.perf_counter() - generating
            held += _encode(encoder, events, parser.finish())
            if final is None:
                raise BackendProtocolError("the backend ended its stream without a result")
            parsed = collect(events, reasoning_opened=parser.reasoning_opened)
            completion = self._completion(plan, final, parsed)
            recorded = await self._record(
                plan, final, completion, plan.codec.response(completion, request=plan.request)
            )
            finished(plan, final, generated_s)
        except PolarError as exc:
            metrics.CALLS.labels(plan.codec.name, exc.error_type).inc()
            if recorded is None:
                await self._record_error(plan, exc)
            if error := "".join(encoder.error(exc)):
                yield error
            return
        except Exception:  # a bug, not the backend's or the caller's fault: still an error event, never a cut
            log.exception("unexpected error in a %s stream", plan.codec.name)
            internal = PolarError("internal error in the gateway; see its log")
            await self._record_error(plan, internal)
            if error := "".join(encoder.error(internal)):
                yield error
            return
        finally:
            await _aclose(chunks)  # a disconnected client stops the generation
            release()
        try:
            if ending := held + "".join(encoder.finish(completion)):
                yield ending
        except BaseException:  # the client left before the last frame: the committed reply was never delivered
            self.undelivered(plan, recorded)
            raise


class Deadline:
    """A stream's deadline: one loop timer for the whole stream (``asyncio.timeout`` around each read made one per
    chunk, 2.5% of the gateway's samples at 1,000 streams). When it passes, the task reading the stream, if one is,
    is cancelled (``StreamingCalls._next`` turns that into ``BackendTimeout``); a stream's reads may move from the
    task that opened it to the one that sends its frames."""

    def __init__(self, seconds: float):
        self.passed = False
        self.waiting: asyncio.Task[Any] | None = None
        self._timer = asyncio.get_running_loop().call_later(seconds, self._pass)

    def _pass(self) -> None:
        self.passed = True
        if self.waiting is not None:
            self.waiting.cancel()

    def cancel(self) -> None:
        self._timer.cancel()


def finished(plan: CallPlan, final: GenerateResult, generated_s: float) -> None:
    """Metrics of a call whose reply is committed: the time it spent beyond generation, its tokens."""
    metrics.CALLS.labels(plan.codec.name, "ok").inc()
    metrics.ADDED_LATENCY.labels(plan.codec.name).observe(max(0.0, time.perf_counter() - plan.started - generated_s))
    metrics.TOKENS.labels("in").inc(len(plan.prompt.ids))
    metrics.TOKENS.labels("out").inc(len(final.output_ids))


async def _aclose(chunks: AsyncIterator[GenerateChunk]) -> None:
    """Close a backend stream (its connection, so the server stops generating); iterators without aclose need none."""
    close = getattr(chunks, "aclose", None)
    if close is not None:
        await close()


def _encode(encoder: StreamEncoder, events: list[Event], new: Sequence[Event]) -> str:
    """The frames of newly parsed events, as one string; every event is also kept for the final parse."""
    frames: list[str] = []
    for event in new:
        events.append(event)
        if not isinstance(event, MalformedToolCall):  # its text already left as a TextDelta; counted at the end
            frames += encoder.on_event(event)
    return "".join(frames)
