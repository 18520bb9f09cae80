"""The streaming half of a model call: frames as tokens arrive, the capture committed before the final event, and
every failure after the first frame ended with the protocol's error event, never a cut stream.

Frames leave one chunk behind the backend: the last content goes out only after the commit, so a stream whose
commit fails never delivers its whole reply (the error event comes instead of its last content); a client that
leaves before the last frame makes its committed capture ``UNACKNOWLEDGED`` (``CallRecorder.undelivered``). A
client that leaves before the reply committed (mid-generation, or before the first token) cuts it: the generation
stops, and an ``UNACKNOWLEDGED`` capture holds its prompt and the ids sampled so far (``CallRecorder.cut``); one
that leaves while the reply commits does not stop the commit, and the committed reply is marked undelivered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from polar import metrics
from polar.errors import BackendProtocolError, PolarError
from polar.inference import GenerateChunk, GenerateResult
from polar.proxy.call.generation import BackendStream, Generated, Generation
from polar.proxy.call.plan import CallPlan
from polar.proxy.call.record import CallRecorder
from polar.slices import turn
from polar.tokens.messages import Message, Role
from polar.tokens.parsers import MalformedToolCall, collect
from polar.tokens.parsers.types import Event
from polar.wire.base import StreamEncoder
from polar.wire.canonical import Completion

log = logging.getLogger(__name__)


async def open_stream(
    plan: CallPlan, generation: Generation, recorder: CallRecorder
) -> tuple[AsyncIterator[str], Callable[[], None]]:
    """Start generating; errors before the first token raise here (a normal error response). Returns the
    frames and the release of the call's in-flight slot: the frames release it when the generation ends;
    the caller calls it too once the response is over (a stream whose client left before it started)."""
    slot = await generation.slot(plan)
    generating = time.perf_counter()
    backend = generation.stream(plan, slot)
    try:
        first = await backend.next()
        if first is None:
            raise BackendProtocolError("the backend ended its stream without a result")
        metrics.TTFT.labels(plan.codec.name).observe(time.perf_counter() - plan.started)
    except PolarError as exc:
        await backend.aclose()
        backend.release()
        await recorder.failure(plan, exc)
        raise
    except BaseException as exc:
        await backend.aclose()
        backend.release()
        if isinstance(exc, asyncio.CancelledError):  # the caller left before the first token
            await recorder.cut(plan, (), (), Message(Role.ASSISTANT))
        raise
    stream = _Stream(plan, generation, recorder, backend)
    return stream.frames(first, generating), backend.release


def error_event(encoder: StreamEncoder, exc: PolarError) -> str:
    """The protocol's error event that ends a stream, as one write (empty when the protocol sends none)."""
    return "".join(encoder.error(exc))


class _Stream:
    """One open stream: its call, and its backend stream (chunks, output check, deadline and slot)."""

    def __init__(self, plan: CallPlan, generation: Generation, recorder: CallRecorder, backend: BackendStream):
        self.plan, self.generation, self.recorder, self.backend = plan, generation, recorder, backend
        self.parser = generation.stream_parser(plan)
        self.events: list[Event] = []
        self.final: GenerateResult | None = None
        self.held = ""  # the last content: it leaves only after the commit, so a failed commit sends none of it
        self.ids: list[int] = []  # sampled so far, with their logprobs: what a cut stream records
        self.logprobs: list[float] = []
        self.committing: asyncio.Future[tuple[int, dict[str, Any]]] | None = None

    async def frames(self, first: GenerateChunk, generating: float) -> AsyncIterator[str]:
        plan, recorder, backend = self.plan, self.recorder, self.backend
        encoder = plan.codec.stream_encoder(plan.meta, request=plan.request)
        recorded: int | None = None  # the capture's id once committed
        self._sampled(first)
        try:
            if opening := "".join(encoder.start()):  # one write per step: a chunk's frames leave together
                yield opening
            async for frames in self._relay(first, encoder):
                yield frames
            backend.release()  # the generation is over: the next call may use the server while this one commits
            generated_s = time.perf_counter() - generating
            final, completion = self._completion(encoder)
            recorded = await self._commit(Generated(final, generated_s), completion)
        except PolarError as exc:
            metrics.CALLS.labels(plan.codec.name, exc.error_type).inc()
            if recorded is None:
                await recorder.failure(plan, exc)
            if error := error_event(encoder, exc):
                yield error
            return
        except Exception:  # a bug, not the backend's or the caller's fault: still an error event, never a cut
            log.exception("unexpected error in a %s stream", plan.codec.name)
            internal = PolarError("internal error in the gateway; see its log")
            await recorder.failure(plan, internal)
            if error := error_event(encoder, internal):
                yield error
            return
        except (asyncio.CancelledError, GeneratorExit):  # the client left before the reply committed
            await self._cut()
            raise
        finally:
            await backend.aclose()  # a disconnected client stops the generation
            backend.release()
        try:
            if ending := self.held + "".join(encoder.finish(completion)):
                yield ending
        except BaseException:  # the client left before the last frame: the committed reply was never delivered
            recorder.undelivered(self.plan, recorded)
            raise

    async def _commit(self, generated: Generated, completion: Completion) -> int:
        """Commit the reply; its capture's id. A client that leaves meanwhile does not stop the commit (a cancelled
        commit may or may not land): the reply commits and is then marked undelivered."""
        commit = self.committing = asyncio.ensure_future(self.recorder.commit_reply(self.plan, generated, completion))
        try:
            recorded, _ = await asyncio.shield(commit)
        except asyncio.CancelledError:
            commit.add_done_callback(self._undelivered)
            raise
        return recorded

    def _undelivered(self, commit: asyncio.Future[tuple[int, dict[str, Any]]]) -> None:
        if not commit.cancelled() and commit.exception() is None:
            self.recorder.undelivered(self.plan, commit.result()[0])

    async def _cut(self) -> None:
        """The client left before the reply committed: the generation stops, then what it sampled is recorded (a
        commit under way records the whole reply instead)."""
        await self.backend.aclose()
        self.backend.release()
        if self.committing is None:
            await self.recorder.cut(self.plan, self.ids, self.logprobs, self._partial_reply())

    def _sampled(self, chunk: GenerateChunk) -> None:
        self.ids += chunk.output_ids
        self.logprobs += chunk.output_logprobs

    def _partial_reply(self) -> Message:
        """The ids sampled before a cut, parsed (what the client may have kept is a prefix of its text)."""
        parsed = self.generation.chat_format.parse(self.ids, self.plan.request.tools, self.plan.prompt.ids)
        return Message(Role.ASSISTANT, parsed.content, parsed.reasoning)

    async def _relay(self, first: GenerateChunk, encoder: StreamEncoder) -> AsyncIterator[str]:
        """The frames of every chunk but the last content, which stays in ``held``; ``final`` is the result."""
        chunk: GenerateChunk | None = first
        while chunk is not None:
            await turn()
            if chunk.output_ids and (frames := _encode(encoder, self.events, self.parser.feed(chunk.output_ids))):
                # One chunk behind: a chunk's frames leave when the next one arrives, so the last content is
                # still here when the commit fails, and the error event replaces it.
                if self.held:
                    yield self.held
                self.held = frames
            self.final = chunk.final or self.final
            chunk = await self.backend.next()
            if chunk is not None:
                self._sampled(chunk)

    def _completion(self, encoder: StreamEncoder) -> tuple[GenerateResult, Completion]:
        """The result and the whole reply once the stream ended (the parser's last events join ``held``)."""
        self.held += _encode(encoder, self.events, self.parser.finish())
        if self.final is None:
            raise BackendProtocolError("the backend ended its stream without a result")
        parsed = collect(self.events, reasoning_opened=self.parser.reasoning_opened)
        return self.final, self.generation.completion(self.plan, self.final, parsed)


def _encode(encoder: StreamEncoder, events: list[Event], new: Sequence[Event]) -> str:
    """The frames of newly parsed events, as one string; every event is also kept for the final parse."""
    frames: list[str] = []
    for event in new:
        events.append(event)
        if not isinstance(event, MalformedToolCall):  # its text already left as a TextDelta; counted at the end
            frames += encoder.on_event(event)
    return "".join(frames)
