"""The call's generation, what both halves of a call (``complete`` and ``stream``) ask of the backend: an in-flight
slot (``slot``), then the generation within the call's deadline with its output checked (``generate``, or
``stream`` chunk by chunk: ``BackendStream``), and the completion its ids parse into (``completion``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from polar.capture_extras import extras_request
from polar.chat.protocol import ChatFormat, OutputStream
from polar.errors import BackendTimeout
from polar.inference import GenerateChunk, GenerateRequest, GenerateResult
from polar.proxy.call.limits import ServerLimits
from polar.proxy.call.output_check import OutputCheck
from polar.proxy.call.plan import CallPlan
from polar.slices import turn
from polar.tokens.parsers.types import ParsedOutput
from polar.wire.canonical import Completion, Usage


@dataclass(frozen=True)
class Generated:
    """A generation that passed its output check: the backend's result, and the seconds from the slot taken to
    its end (what the call's added latency leaves out)."""

    final: GenerateResult
    seconds: float


@dataclass
class Generation:
    """``limit``: the inference servers' in-flight slots (None: unbounded); ``deadline_s``: the whole
    generation's; ``vocab_size``: what an output id must be below."""

    chat_format: ChatFormat  # the model family's: parses sampled ids, whatever the family
    vocab_size: int
    deadline_s: float = 900.0
    limit: ServerLimits | None = None

    async def slot(self, plan: CallPlan) -> Callable[[], None]:
        """Take an in-flight slot of the inference server the call routes to (scripted policies need none); returns its
        release, which may be called more than once. In its turn: a burst of plans each opening a backend call
        in one iteration would hold the loop for all of them. ``Overloaded`` when none frees in time."""
        await turn()
        limit = self.limit
        if limit is None or plan.policy.scripted:
            return _nothing
        server = limit.of(plan.session.id or plan.meta.completion_id)
        await server.acquire()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                server.release()

        return release

    async def generate(self, plan: CallPlan, slot: Callable[[], None]) -> Generated:
        """The whole generation (not streamed) within the deadline (else ``BackendTimeout``), its output checked
        (``BackendProtocolError``); ``slot`` is released as soon as the backend answers."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.deadline_s):
                final = await plan.policy.generate(self._request(plan), plan.context)
        except TimeoutError:
            raise self._timeout() from None
        finally:
            slot()
            seconds = time.perf_counter() - started
        self._check(plan).result(final)
        return Generated(final, seconds)

    def stream(self, plan: CallPlan, slot: Callable[[], None]) -> BackendStream:
        """The generation, streamed: its chunks checked as they arrive, within the deadline."""
        deadline = Deadline(self.deadline_s)
        chunks = plan.policy.stream(self._request(plan), plan.context)
        return BackendStream(chunks, self._check(plan), deadline, self._timeout, slot)

    def stream_parser(self, plan: CallPlan) -> OutputStream:
        return self.chat_format.stream_parser(plan.request.tools, plan.prompt.ids)

    def completion(self, plan: CallPlan, final: GenerateResult, parsed: ParsedOutput | None = None) -> Completion:
        """The call's completion: ``final``'s ids parsed (``parsed``: already, by a stream's parser)."""
        if parsed is None:
            parsed = self.chat_format.parse(final.output_ids, plan.request.tools, plan.prompt.ids)
        return Completion(
            id=plan.meta.completion_id,
            model=plan.request.model,
            created=plan.meta.created,
            content=parsed.content,
            reasoning=parsed.reasoning,
            tool_calls=tuple(parsed.tool_calls),
            finish_reason=final.finish_reason,
            usage=Usage(len(plan.prompt.ids), len(final.output_ids)),
            matched_stop=final.matched_stop,
            malformed_tool_calls=len(parsed.malformed),
        )

    @staticmethod
    def _request(plan: CallPlan) -> GenerateRequest:
        return GenerateRequest(
            plan.prompt.ids,
            plan.sampling,
            request_id=plan.meta.completion_id,
            session_id=plan.session.id,
            extras=extras_request(plan.session.capture, plan.prompt),
            input_ids_json=plan.ids_text,
        )

    def _check(self, plan: CallPlan) -> OutputCheck:
        return OutputCheck(vocab_size=self.vocab_size, max_new_tokens=plan.sampling.max_new_tokens)

    def _timeout(self) -> BackendTimeout:
        return BackendTimeout(f"the backend did not finish the generation within {self.deadline_s:g} s")


class BackendStream:
    """An open backend stream: ``next`` reads its chunks, each checked, within the call's deadline; ``release``
    frees its in-flight slot (and the deadline's timer) and may be called more than once; ``aclose`` closes the
    backend's stream (its connection, so the server stops generating)."""

    def __init__(
        self,
        chunks: AsyncIterator[GenerateChunk],
        check: OutputCheck,
        deadline: Deadline,
        timeout: Callable[[], BackendTimeout],
        slot: Callable[[], None],
    ):
        self._chunks, self._check, self._deadline, self._timeout, self._slot = chunks, check, deadline, timeout, slot

    async def next(self) -> GenerateChunk | None:
        """The next chunk, checked, or None at the end; ``BackendTimeout`` once the deadline has passed."""
        chunk = await next_chunk(self._chunks, self._deadline, self._timeout)
        if chunk is not None:
            self._check.chunk(chunk.output_ids, chunk.output_logprobs)
            if chunk.final is not None:
                self._check.result(chunk.final, streamed=True)
        return chunk

    def release(self) -> None:
        self._deadline.cancel()
        self._slot()

    async def aclose(self) -> None:
        close = getattr(self._chunks, "aclose", None)  # iterators without aclose need none
        if close is not None:
            await close()


class Deadline:
    """A stream's deadline: one loop timer for the whole stream (``asyncio.timeout`` around each read made one per
    chunk, 2.5% of the gateway's samples at 1,000 streams). When it passes, the task reading the stream, if one is,
    is cancelled (``next_chunk`` turns that into ``BackendTimeout``); a stream's reads may move from the task that
    opened it to the one that sends its frames."""

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


async def next_chunk(
    chunks: AsyncIterator[GenerateChunk], deadline: Deadline, timeout: Callable[[], BackendTimeout]
) -> GenerateChunk | None:
    """The next chunk, or None at the end; ``timeout()`` raised once the call's deadline has passed."""
    if deadline.passed:
        raise timeout()
    task = deadline.waiting = asyncio.current_task()
    try:
        return await anext(chunks, None)
    except asyncio.CancelledError:
        if deadline.passed and task is not None and task.uncancel() == 0:
            raise timeout() from None
        raise
    finally:
        deadline.waiting = None


def _nothing() -> None:
    return None
