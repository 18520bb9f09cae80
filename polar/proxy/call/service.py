"""One model call through the gateway, whatever its protocol:

    session (once, from the key) → body read and decoded (codec) → plan: the earlier call it extends, prompt
    ids (append mode), sampling, admission → generate (streamed or not) → detokenize + parse → encode (codec)
    → commit the capture → only then the final event / the response body

A failed generation is recorded as an ERROR capture before the error reaches the harness. If the store
cannot commit, the harness gets a provider-shaped 503 and never a finished reply.

Bounded and checked: the whole generation has a deadline (``backend_deadline_s``; a 504 ``BackendTimeout``), every
store wait another (``store_timeout_s``; a 503 ``StoreError``), and the backend's output passes ``OutputCheck``
(ids in the vocabulary, at most max_new_tokens, finite logprobs, aligned lengths) before it is decoded, stored
or sent. A stream that fails after its first frame ends with the protocol's error event, never cut.

The stages are modules of their own: ``intake``, ``plan``, ``complete`` / ``stream`` (around ``generation``)
and ``record``; this class wires them for the HTTP layer, which shapes only the response.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

from polar.proxy.call.complete import Reply, complete
from polar.proxy.call.generation import Generation
from polar.proxy.call.intake import BodyReader, Decoded, Intake
from polar.proxy.call.limits import ServerLimits
from polar.proxy.call.plan import CallPlan, Planner
from polar.proxy.call.policy import Policy
from polar.proxy.call.record import CallRecorder
from polar.proxy.call.stream import open_stream
from polar.proxy.session.sessions import SessionInfo
from polar.slices import in_thread
from polar.tokens.render import PromptBuilder, SealedText
from polar.wire.base import ProtocolCodec


class CallService:
    def __init__(
        self,
        *,
        intake: Intake,
        planner: Planner,
        generation: Generation,
        recorder: CallRecorder,
        builder: PromptBuilder,
        policy_for: Callable[[SessionInfo], Policy],
    ):
        self.intake = intake
        self.planner = planner
        self.generation = generation
        self.recorder = recorder
        self.builder = builder
        self.policy_for = policy_for  # the backend, or the session's scripted policy

    async def receive(
        self, key: str | None, read: BodyReader, codec: ProtocolCodec, *, model: str | None, stream: bool | None
    ) -> CallPlan:
        """A call's plan: its session resolved from ``key`` (before ``read`` reads the body), the body decoded,
        the session's history consulted."""
        started = time.perf_counter()
        session = await self.intake.session(key)
        decoded = await self.intake.decode(session, read, codec, model, stream)
        try:
            return await self._plan(session, codec, decoded, started)
        except SealedText:  # its build renders messages it took sealed from the session's history
            return await self._plan(
                session, codec, await self.intake.decode_whole(decoded, codec, model, stream), started
            )

    async def _plan(self, session: SessionInfo, codec: ProtocolCodec, decoded: Decoded, started: float) -> CallPlan:
        return await self.planner.plan(
            session,
            codec,
            decoded.body,
            decoded.request,
            self.policy_for(session),
            started,
            tools_chars=decoded.tool_chars,
            digest=decoded.digest,
            cut=decoded.cut,
        )

    async def count_tokens(self, key: str | None, read: BodyReader, codec: ProtocolCodec, *, model: str | None) -> int:
        """How many prompt ids the body renders to (``count_tokens`` / ``countTokens``); nothing is recorded."""
        session = await self.intake.session(key)
        decoded = await self.intake.decode(session, read, codec, model, False, count=True)
        chat = decoded.request
        return len(await in_thread(self.builder.canonical_ids, chat.messages, chat.tools))  # tokenizing: off the loop

    async def complete(self, plan: CallPlan) -> Reply:
        return await complete(plan, self.generation, self.recorder)

    def undelivered(self, plan: CallPlan, capture_id: int) -> None:
        """The committed reply ``capture_id`` never reached its caller (``CallRecorder.undelivered``)."""
        self.recorder.undelivered(plan, capture_id)

    async def open_stream(self, plan: CallPlan) -> tuple[AsyncIterator[str], Callable[[], None]]:
        return await open_stream(plan, self.generation, self.recorder)

    @property
    def limit(self) -> ServerLimits | None:
        return self.generation.limit

    @property
    def context_length(self) -> int:
        return self.planner.context_length

    @property
    def max_token_chars(self) -> int:
        return self.planner.max_token_chars
