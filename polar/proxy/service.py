"""One model call through the gateway, whatever its protocol.

    authenticate → decode (codec) → earlier calls of the session → prompt ids (append mode)
    → generate (stream) → detokenize + parse incrementally → encode (codec)
    → commit the capture → only then the final event / the response body

A failed generation is recorded as an ERROR capture before the error reaches the harness. If the store
cannot commit, the harness gets a provider-shaped 503 and never a finished reply.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from array import array
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from db.request_json import compact_request
from polar.backends.base import GenerateChunk, GenerateRequest, GenerateResult, SamplingParams
from polar.capture import capture_row
from polar.errors import BackendProtocolError, ContextLengthExceeded, NotFound, PolarError
from polar.proxy.canonical import ChatRequest, Completion, Usage
from polar.proxy.history import CallNode, HistoryCache
from polar.proxy.policy import Policy, PolicyContext
from polar.proxy.protocols.base import ProtocolCodec, StreamMeta
from polar.proxy.recorder import CaptureWriter
from polar.proxy.sessions import SessionInfo
from polar.settings import RenderMode
from polar.tokens.detokenize import IncrementalDecoder
from polar.tokens.messages import Message, Role
from polar.tokens.parsers import MalformedToolCall, ToolCallFormat, collect
from polar.tokens.render import Prompt, PromptBuilder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallPlan:
    """Everything decided before generation starts."""

    session: SessionInfo
    codec: ProtocolCodec
    body: dict[str, Any]
    request: ChatRequest
    prompt: Prompt
    sampling: SamplingParams
    policy: Policy
    context: PolicyContext
    meta: StreamMeta


class CallService:
    def __init__(
        self,
        *,
        builder: PromptBuilder,
        tool_format: ToolCallFormat,
        histories: HistoryCache,
        writer: CaptureWriter,
        context_length: int,
        default_max_tokens: int,
        render_mode: RenderMode,
        backend_name: str,
    ):
        self.builder = builder
        self.tool_format = tool_format
        self.histories = histories
        self.writer = writer
        self.context_length = context_length
        self.default_max_tokens = default_max_tokens
        self.render_mode = render_mode
        self.backend_name = backend_name

    # ---- planning ---------------------------------------------------------------------------------

    def plan(
        self, session: SessionInfo, codec: ProtocolCodec, body: Any, request: ChatRequest, policy: Policy
    ) -> CallPlan:
        """Build the prompt and sampling parameters (blocking: runs in a worker thread)."""
        if session.models and request.model not in session.models:
            raise NotFound(
                f"model {request.model!r} is not served for this session; use one of {list(session.models)}",
                field="model",
            )
        history = self.histories.load(session.id)
        prompt = self.builder.build(request.messages, request.tools, history.prior_calls(), self.render_mode)
        budget = self.context_length - len(prompt.ids)
        if budget <= 0:
            raise ContextLengthExceeded(len(prompt.ids), self.context_length)
        wanted = request.max_tokens if request.max_tokens is not None else self.default_max_tokens
        sampling = SamplingParams.parse({**request.sampling, "max_new_tokens": min(wanted, budget)})
        meta = StreamMeta(uuid.uuid4().hex[:24], request.model, int(time.time()), len(prompt.ids))
        context = PolicyContext(session.id, step=history.tool_steps, has_tools=bool(request.tools))
        return CallPlan(session, codec, body, request, prompt, sampling, policy, context, meta)

    @staticmethod
    def _request(plan: CallPlan) -> GenerateRequest:
        return GenerateRequest(plan.prompt.ids, plan.sampling, request_id=plan.meta.completion_id)

    # ---- non-streaming ----------------------------------------------------------------------------

    async def complete(self, plan: CallPlan) -> dict[str, Any]:
        try:
            final = await plan.policy.generate(self._request(plan), plan.context)
        except PolarError as exc:
            await self._record_error(plan, exc)
            raise
        parsed_events = self._parse_all(final.output_ids)
        completion = self._completion(plan, final, parsed_events)
        response = plan.codec.response(completion, request=plan.request)
        await self._record(plan, final, completion, response)
        return response

    # ---- streaming --------------------------------------------------------------------------------

    async def open_stream(self, plan: CallPlan) -> AsyncIterator[str]:
        """Start generating; errors before the first token raise here (a normal error response)."""
        chunks = plan.policy.stream(self._request(plan), plan.context)
        try:
            first = await anext(chunks)
        except StopAsyncIteration:  # pragma: no cover - backends always send a final chunk
            raise BackendProtocolError("the backend ended its stream without a result") from None
        except PolarError as exc:
            await self._record_error(plan, exc)
            raise
        return self._frames(plan, first, chunks)

    async def _frames(
        self, plan: CallPlan, first: GenerateChunk, chunks: AsyncIterator[GenerateChunk]
    ) -> AsyncIterator[str]:
        encoder = plan.codec.stream_encoder(plan.meta, request=plan.request)
        decoder = IncrementalDecoder(self.builder.tokenizer)
        parser = self.tool_format.stream_parser(tools=plan.request.tools)
        events: list = []
        final: GenerateResult | None = None
        for frame in encoder.start():
            yield frame
        try:
            chunk: GenerateChunk | None = first
            while chunk is not None:
                if chunk.output_ids:
                    for frame in _encode(encoder, events, parser.feed(decoder.feed(chunk.output_ids))):
                        yield frame
                final = chunk.final or final
                chunk = await anext(chunks, None)
            for frame in _encode(encoder, events, parser.feed(decoder.flush()) + parser.finish()):
                yield frame
            if final is None:
                raise BackendProtocolError("the backend ended its stream without a result")
            parsed = collect(events, reasoning_opened=parser.reasoning_opened)
            completion = self._completion(plan, final, parsed)
            await self._record(plan, final, completion, plan.codec.response(completion, request=plan.request))
        except PolarError as exc:
            if final is None:
                await self._record_error(plan, exc)
            for frame in encoder.error(exc):
                yield frame
            return
        finally:
            await chunks.aclose()  # a disconnected client stops the generation
        for frame in encoder.finish(completion):
            yield frame

    # ---- shared -----------------------------------------------------------------------------------

    def _parse_all(self, output_ids):
        text = self.builder.tokenizer.decode(output_ids, skip_special_tokens=True)
        return self.tool_format.parse(text)

    def _completion(self, plan: CallPlan, final: GenerateResult, parsed) -> Completion:
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

    async def _stored_request(self, plan: CallPlan) -> Any:
        """The request as stored: relative to the parent capture's (db.request_json)."""
        parent = plan.prompt.parent
        if parent is None or parent.ref is None:
            return compact_request(plan.body, None)
        parent_body = await asyncio.to_thread(self.histories.parent_body, plan.session.id, parent.ref)
        return compact_request(plan.body, parent_body)

    async def _record(self, plan: CallPlan, final: GenerateResult, completion: Completion, response: dict) -> None:
        row = capture_row(
            rollout_id=plan.session.id,
            seq=-1,  # assigned by the writer
            protocol=plan.codec.name,
            model=plan.request.model,
            backend=plan.policy.name,
            request_json=await self._stored_request(plan),
            prompt=plan.prompt,
            sampling=plan.sampling,
            result=final,
            response_json=response,
        )
        row.n_malformed_tool_calls = completion.malformed_tool_calls
        row.scripted = plan.policy.scripted
        capture_id = await self.writer.write(row)
        self.histories.remember_body(plan.session.id, capture_id, plan.body)
        reply = Message(Role.ASSISTANT, completion.content, completion.reasoning, completion.tool_calls)
        parent = plan.prompt.parent
        self.histories.add(
            plan.session.id,
            CallNode(
                id=capture_id,
                parent_id=parent.ref if parent is not None else None,
                prefix_len=plan.prompt.prefix_len,
                prompt_delta_ids=array("i", plan.prompt.delta_ids),
                output_ids=array("i", final.output_ids),
                n_prompt=len(plan.prompt.ids),
                messages=plan.request.messages,
                tools=plan.request.tools,
                reply=reply,
            ),
        )

    async def _record_error(self, plan: CallPlan, error: PolarError) -> None:
        """Record a failed generation. If even that fails, the original error still reaches the caller."""
        try:
            row = capture_row(
                rollout_id=plan.session.id,
                seq=-1,
                protocol=plan.codec.name,
                model=plan.request.model,
                backend=plan.policy.name,
                request_json=await self._stored_request(plan),
                prompt=plan.prompt,
                sampling=plan.sampling,
                result=None,
                error=f"{error.error_type}: {error.message}",
            )
            row.scripted = plan.policy.scripted
            await self.writer.write(row)
        except PolarError:
            log.warning("could not record the failed call of session %s", plan.session.id)


def _encode(encoder, events: list, new: list) -> list[str]:
    """Frames for newly parsed events; every event is also kept for the final parse."""
    frames: list[str] = []
    for event in new:
        events.append(event)
        if not isinstance(event, MalformedToolCall):  # its text already left as a TextDelta; counted at the end
            frames += encoder.on_event(event)
    return frames
