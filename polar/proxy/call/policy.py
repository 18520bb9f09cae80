"""Who answers a session's calls: the configured backend, or a scripted policy for tests and debugging.

A scripted policy exists only to make a harness take specific actions. Its replies are written in the model
family's own format (``ChatFormat.reply_ids``) as real token ids and scored by the real local model, so
captures still hold true token ids and true logprobs of those ids.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from polar.chat.protocol import ChatFormat
from polar.inference import (
    Backend,
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    VersionSpan,
    collect,
)
from polar.wire.policy import ScriptedPolicySpec, ScriptedReply

if TYPE_CHECKING:  # torch, imported by the engine, is not loaded by a gateway that never scores
    from polar.models.engine import LocalEngine


@dataclass(frozen=True)
class PolicyContext:
    session_id: str
    step: int  # calls with tools this session has already been answered
    has_tools: bool
    tool_free_step: int = 0  # calls without tools this session has already been answered


class Policy(Protocol):
    name: str
    scripted: bool  # its replies are written, not sampled: their captures never train

    async def generate(self, request: GenerateRequest, context: PolicyContext) -> GenerateResult: ...

    def stream(self, request: GenerateRequest, context: PolicyContext) -> AsyncIterator[GenerateChunk]: ...


class BackendPolicy:
    """The configured inference backend: the real policy."""

    scripted = False

    def __init__(self, backend: Backend):
        self.backend = backend
        self.name = backend.name

    async def generate(self, request: GenerateRequest, context: PolicyContext) -> GenerateResult:
        # Not a drained stream: SGLang's default stream resends everything so far in every chunk.
        return await self.backend.generate(request)

    def stream(self, request: GenerateRequest, context: PolicyContext) -> AsyncIterator[GenerateChunk]:
        return self.backend.stream(request)


class ScriptedPolicy:
    name = "scripted"
    scripted = True

    def __init__(self, spec: ScriptedPolicySpec, scorer: LocalEngine, chat_format: ChatFormat):
        self.spec = spec
        self.scorer = scorer
        self.chat_format = chat_format

    def reply_for(self, context: PolicyContext) -> ScriptedReply:
        if not context.has_tools:
            if context.tool_free_step < len(self.spec.tool_free_replies):
                return self.spec.tool_free_replies[context.tool_free_step]
            return ScriptedReply(content=self.spec.tool_free_reply)
        if context.step < len(self.spec.replies):
            return self.spec.replies[context.step]
        return ScriptedReply(content=self.spec.then)

    async def generate(self, request: GenerateRequest, context: PolicyContext) -> GenerateResult:
        return await collect(self.stream(request, context))

    async def stream(self, request: GenerateRequest, context: PolicyContext) -> AsyncIterator[GenerateChunk]:
        started = time.perf_counter()
        if self.spec.delay_s:
            await asyncio.sleep(self.spec.delay_s)
        ids = self.chat_format.reply_ids(self.reply_for(context).message())
        self.scorer.validate(request)
        budget = min(request.sampling.max_new_tokens, self.scorer.context_length - len(request.input_ids))
        finish, matched = (FinishReason.STOP, ids[-1]) if len(ids) <= budget else (FinishReason.LENGTH, None)
        ids = ids[:budget]
        logprobs = await self.scorer.score(list(request.input_ids), ids, request.sampling.temperature)
        ttft = time.perf_counter() - started  # the whole reply is ready once it is scored
        for token, logprob in zip(ids, logprobs, strict=True):
            yield GenerateChunk((token,), (logprob,))
        yield GenerateChunk(
            (),
            (),
            final=GenerateResult(
                output_ids=tuple(ids),
                output_logprobs=tuple(logprobs),
                finish_reason=finish,
                matched_stop=matched,
                version_spans=(VersionSpan(self.scorer.weight_version, 0, len(ids)),),
                prompt_tokens=len(request.input_ids),
                logprob_semantics=self.scorer.semantics,
                ttft_s=ttft,
                e2e_s=time.perf_counter() - started,
            ),
        )
