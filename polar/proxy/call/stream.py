"""The streaming half of a model call: frames as tokens arrive, the capture committed before the final event, and
every failure after the first frame ended with the protocol's error event, never a cut stream.

Frames leave one chunk behind the backend: the last content goes out only after the commit, so a stream whose
commit fails never delivers its whole reply (the error event comes instead of its last content); a client that
leaves before the last frame makes its committed capture ``UNACKNOWLEDGED`` (``CallRecorder.undelivered``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

from polar import metrics
from polar.errors import BackendProtocolError, PolarError
from polar.inference import GenerateChunk, GenerateResult
from polar.proxy.call.generation import Deadline, Generation, finished, next_chunk
from polar.proxy.call.output_check import OutputCheck
from polar.proxy.call.plan import CallPlan
from polar.proxy.call.record import CallRecorder
from polar.slices import turn
from polar.tokens.parsers import MalformedToolCall, collect
from polar.tokens.parsers.types import Event
from polar.wire.base import StreamEncoder

log = logging.getLogger(__name__)


def _check_chunk(check: OutputCheck, chunk: GenerateChunk) -> None:
    check.chunk(chunk.output_ids, chunk.output_logprobs)
    if chunk.final is not None:
        check.result(chunk.final, streamed=True)


async def open_stream(
    plan: CallPlan, generation: Generation, recorder: CallRecorder
) -> tuple[AsyncIterator[str], Callable[[], None]]:
    """Start generating; errors before the first token raise here (a normal error response). Returns the
    frames and the release of the call's in-flight slot: the frames release it when the generation ends;
    the caller calls it too once the response is over (a stream whose client left before it started)."""
    slot = await generation.slot(plan)
    generating = time.perf_counter()
    check = generation.check(plan)
    deadline = Deadline(generation.deadline_s)

    def release() -> None:
        deadline.cancel()
        slot()

    chunks = plan.policy.stream(generation.request(plan), plan.context)
    try:
        first = await next_chunk(chunks, deadline, generation.timeout)
        if first is None:
            raise BackendProtocolError("the backend ended its stream without a result")
        _check_chunk(check, first)
        metrics.TTFT.labels(plan.codec.name).observe(time.perf_counter() - plan.started)
    except PolarError as exc:
        await _aclose(chunks)
        release()
        await recorder.failure(plan, exc)
        raise
    except BaseException:
        await _aclose(chunks)
        release()
        raise
    stream = _Stream(plan, generation, recorder, chunks, check, deadline, release)
    return stream.frames(first, generating), release


class _Stream:
    """One open stream: its backend chunks, output check, deadline and slot."""

    def __init__(
        self,
        plan: CallPlan,
        generation: Generation,
        recorder: CallRecorder,
        chunks: AsyncIterator[GenerateChunk],
        check: OutputCheck,
        deadline: Deadline,
        release: Callable[[], None],
    ):
        self.plan, self.generation, self.recorder = plan, generation, recorder
        self.chunks, self.check, self.deadline, self.release = chunks, check, deadline, release

    async def frames(self, first: GenerateChunk, generating: float) -> AsyncIterator[str]:
        plan, generation, recorder, chunks = self.plan, self.generation, self.recorder, self.chunks
        encoder = plan.codec.stream_encoder(plan.meta, request=plan.request)
        parser = generation.chat_format.stream_parser(plan.request.tools, plan.prompt.ids)
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
                chunk = await next_chunk(chunks, self.deadline, generation.timeout)
                if chunk is not None:
                    _check_chunk(self.check, chunk)
            self.release()  # the generation is over: the next call may use the server while this one commits
            generated_s = time.perf_counter() - generating
            held += _encode(encoder, events, parser.finish())
            if final is None:
                raise BackendProtocolError("the backend ended its stream without a result")
            parsed = collect(events, reasoning_opened=parser.reasoning_opened)
            completion = generation.completion(plan, final, parsed)
            recorded = await recorder.reply(
                plan, final, completion, plan.codec.response(completion, request=plan.request)
            )
            finished(plan, final, generated_s)
        except PolarError as exc:
            metrics.CALLS.labels(plan.codec.name, exc.error_type).inc()
            if recorded is None:
                await recorder.failure(plan, exc)
            if error := "".join(encoder.error(exc)):
                yield error
            return
        except Exception:  # a bug, not the backend's or the caller's fault: still an error event, never a cut
            log.exception("unexpected error in a %s stream", plan.codec.name)
            internal = PolarError("internal error in the gateway; see its log")
            await recorder.failure(plan, internal)
            if error := "".join(encoder.error(internal)):
                yield error
            return
        finally:
            await _aclose(chunks)  # a disconnected client stops the generation
            self.release()
        try:
            if ending := held + "".join(encoder.finish(completion)):
                yield ending
        except BaseException:  # the client left before the last frame: the committed reply was never delivered
            recorder.undelivered(plan, recorded)
            raise


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
