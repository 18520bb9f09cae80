"""What both halves of a call (``complete`` and ``stream``) do around the backend: take an in-flight slot, send
the request, check the output, parse it into a completion, and the call's deadline and metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from polar import metrics
from polar.capture_extras import extras_request
from polar.chat.protocol import ChatFormat
from polar.errors import BackendTimeout
from polar.inference import GenerateChunk, GenerateRequest, GenerateResult
from polar.proxy.call.limits import ServerLimits
from polar.proxy.call.output_check import OutputCheck
from polar.proxy.call.plan import CallPlan
from polar.slices import turn
from polar.tokens.parsers.types import ParsedOutput
from polar.wire.canonical import Completion, Usage


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
        in one iteration would hold the loop for all of them."""
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

    @staticmethod
    def request(plan: CallPlan) -> GenerateRequest:
        return GenerateRequest(
            plan.prompt.ids,
            plan.sampling,
            request_id=plan.meta.completion_id,
            session_id=plan.session.id,
            extras=extras_request(plan.session.capture, plan.prompt),
        )

    def check(self, plan: CallPlan) -> OutputCheck:
        return OutputCheck(vocab_size=self.vocab_size, max_new_tokens=plan.sampling.max_new_tokens)

    def timeout(self) -> BackendTimeout:
        return BackendTimeout(f"the backend did not finish the generation within {self.deadline_s:g} s")

    def parse(self, plan: CallPlan, output_ids: Sequence[int]) -> ParsedOutput:
        return self.chat_format.parse(output_ids, plan.request.tools, plan.prompt.ids)

    @staticmethod
    def completion(plan: CallPlan, final: GenerateResult, parsed: ParsedOutput) -> Completion:
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


def finished(plan: CallPlan, final: GenerateResult, generated_s: float) -> None:
    """Metrics of a call whose reply is committed: the time it spent beyond generation, its tokens."""
    metrics.CALLS.labels(plan.codec.name, "ok").inc()
    metrics.ADDED_LATENCY.labels(plan.codec.name).observe(max(0.0, time.perf_counter() - plan.started - generated_s))
    metrics.TOKENS.labels("in").inc(len(plan.prompt.ids))
    metrics.TOKENS.labels("out").inc(len(final.output_ids))


def _nothing() -> None:
    return None
