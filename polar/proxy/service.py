"""One model call through the gateway, whatever its protocol.

    authenticate → decode (codec) → earlier calls of the session → prompt ids (append mode)
    → generate (stream) → detokenize + parse incrementally → encode (codec)
    → commit the capture → only then the final event / the response body

A failed generation is recorded as an ERROR capture before the error reaches the harness. If the store
cannot commit, the harness gets a provider-shaped 503 and never a finished reply.

Bounded and checked: the whole generation has a deadline (``backend_deadline_s``; a 504 ``BackendTimeout``), every
store wait another (``store_timeout_s``; a 503 ``StoreError``), and the backend's output passes ``OutputCheck``
(ids in the vocabulary, at most max_new_tokens, finite logprobs, aligned lengths) before it is decoded, stored
or sent. A stream that fails after its first frame ends with the protocol's error event, never cut.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from db.enums import Admission
from db.request_json import compact_request
from polar import metrics
from polar.capture_extras import apply_extras, extras_request
from polar.chat.protocol import ChatFormat
from polar.errors import (
    BackendTimeout,
    ContextLengthExceeded,
    InvalidRequest,
    NotFound,
    PolarError,
    StoreError,
)
from polar.ids import random_hex
from polar.inference import GenerateRequest, GenerateResult, SamplingParams
from polar.proxy.admission import Verdict, admit
from polar.proxy.call_node import CallNode
from polar.proxy.capture_row import capture_row
from polar.proxy.cost import message_chars, surely_too_long
from polar.proxy.history import HistoryCache, SessionHistory
from polar.proxy.limits import InFlightLimit
from polar.proxy.output_check import OutputCheck
from polar.proxy.policy import Policy, PolicyContext
from polar.proxy.recorder import CaptureWriter
from polar.proxy.sessions import SessionInfo
from polar.proxy.streaming import StreamingCalls, finished
from polar.settings import RenderMode
from polar.slices import in_thread, turn
from polar.tokens.messages import Message, Role
from polar.tokens.parsers.types import ParsedOutput
from polar.tokens.render import PriorCall, Prompt, PromptBuilder
from polar.wire.base import ProtocolCodec, StreamMeta
from polar.wire.canonical import ChatRequest, Completion, Usage

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_MODEL_NAME = 256  # the width of captures.model
INLINE_CHARS = 16_384  # a build tokenizing up to this much text runs on the event loop (about 1 ms at most)


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
    started: float = 0.0  # perf_counter when the call arrived (metrics)
    admission: Verdict = Verdict(Admission.ROOT)  # how the call enters the capture tree (polar.proxy.admission)


class _Stale(Exception):
    """The request may extend a call this process has not loaded yet."""


class CallService(StreamingCalls):
    def __init__(
        self,
        *,
        builder: PromptBuilder,
        chat_format: ChatFormat,
        histories: HistoryCache,
        writer: CaptureWriter,
        context_length: int,
        default_max_tokens: int,
        render_mode: RenderMode,
        backend_name: str,
        vocab_size: int,
        max_token_chars: int = 0,
        backend_deadline_s: float = 900.0,
        store_timeout_s: float = 30.0,
        limit: InFlightLimit | None = None,
    ):
        self.builder = builder
        self.chat_format = chat_format  # the model family's: parses sampled ids, whatever the family
        self._family_stops = frozenset(chat_format.stop_ids)  # its end-of-turn ids: sent with every generation
        self.histories = histories
        self.writer = writer
        self.context_length = context_length
        self.default_max_tokens = default_max_tokens
        self.render_mode = render_mode
        self.backend_name = backend_name
        self.vocab_size = vocab_size
        self.max_token_chars = max_token_chars
        self.backend_deadline_s = backend_deadline_s
        self.store_timeout_s = store_timeout_s
        self.limit = limit

    # ---- planning ---------------------------------------------------------------------------------

    def _parent(
        self, session: SessionInfo, request: ChatRequest, history: SessionHistory, fresh: bool, tools_chars: int = 0
    ) -> tuple[tuple[PriorCall, int] | None, int]:
        """The request checked, the earlier call it extends (cheap: no tokenizing) and how many characters the
        prompt's build tokenizes (``tools_chars``: its tool definitions', when a whole render writes them).
        Unless ``fresh`` (the history was just read from the store), a request holding an assistant message no
        known call explains raises ``_Stale``: a call this process has not seen (another replica's) may be its
        parent."""
        if "\x00" in request.model or len(request.model) > MAX_MODEL_NAME:
            raise InvalidRequest(
                f"model: a model name has at most {MAX_MODEL_NAME} characters and no NUL", field="model"
            )
        if session.models and request.model not in session.models:
            raise NotFound(
                f"model {request.model!r} is not served for this session; use one of {list(session.models)}",
                field="model",
            )
        messages = request.messages
        found = self.builder.find_parent(messages, request.tools, history.candidates(len(messages)), ordered=True)
        # Of an append-mode extension only the new messages are tokenized (the rest are the parent's ids).
        only_new = found is not None and self._appends and self.builder.tokenizes_only_new_messages
        chars = message_chars(messages[found[1] if found is not None and only_new else 0 :])
        if found is None or not only_new:
            chars += tools_chars
        self.refuse_surely_too_long(chars)
        if not fresh and any(m.role is Role.ASSISTANT for m in messages[found[1] if found else 0 :]):
            raise _Stale()
        return found, chars

    def _build(
        self,
        session: SessionInfo,
        codec: ProtocolCodec,
        body: Any,
        request: ChatRequest,
        policy: Policy,
        history: SessionHistory,
        found: tuple[PriorCall, int] | None,
        started: float | None,
    ) -> CallPlan:
        """The prompt ids (tokenizing: a whole conversation when no earlier call is extended) and the plan."""
        prompt = self.builder.build_on(
            found, request.messages, request.tools, self.render_mode, had_candidates=bool(history.nodes)
        )
        budget = self.context_length - len(prompt.ids)
        if budget <= 0:
            raise ContextLengthExceeded(len(prompt.ids), self.context_length)
        wanted = request.max_tokens if request.max_tokens is not None else self.default_max_tokens
        # The family's end-of-turn ids go with every generation: an engine that knows only the tokenizer's EOS
        # would otherwise run past a turn's end (a client's own stop ids are kept).
        stops = {"stop_token_ids": self._stop_ids(request.sampling.get("stop_token_ids"))}
        sampling = SamplingParams.parse({**request.sampling, **stops, "max_new_tokens": min(wanted, budget)})
        meta = StreamMeta(random_hex(12), request.model, int(time.time()), len(prompt.ids))
        context = PolicyContext(
            session.id, step=history.tool_steps, has_tools=bool(request.tools), tool_free_step=history.tool_free_steps
        )
        started = time.perf_counter() if started is None else started
        first = history.next_seq == 0 and not history.ahead and not history.nodes
        verdict = admit(request.messages, request.tools, found, history.prior_calls, first=first)
        return CallPlan(session, codec, body, request, prompt, sampling, policy, context, meta, started, verdict)

    async def plan_call(
        self,
        session: SessionInfo,
        codec: ProtocolCodec,
        body: Any,
        request: ChatRequest,
        policy: Policy,
        started: float | None = None,
        *,
        tools_chars: int = 0,
    ) -> CallPlan:
        """``plan`` with the session's history: from memory in the steady state, read from the store (only the
        captures this process lacks) on a session's first call here, after a seq this process skipped, or
        when the request holds a reply no known call explains. A build that tokenizes little (an append-mode
        extension by a few messages, a short conversation rendered whole) is planned on the event loop, one piece of
        work among others; a long text in a worker thread. (Not every build: Python work in threads competes with
        the loop for the GIL, and a thousand first calls rendered in threads starved it for tens of milliseconds
        at a time.) ``tools_chars``: the characters of the request's tool definitions (``polar.proxy.cost``), which
        count towards that when the build renders them."""
        history = self.histories.cached(session.id)
        fresh = history is None
        if history is None:
            history = await self.load_history(session.id)
        try:
            found, chars = self._parent(session, request, history, fresh, tools_chars)
        except _Stale:
            history = await self.load_history(session.id)
            found, chars = self._parent(session, request, history, True, tools_chars)
        args = (session, codec, body, request, policy, history, found, started)
        if chars <= INLINE_CHARS:
            return self._build(*args)
        return await in_thread(self._build, *args)

    def _stop_ids(self, asked: Any) -> Any:
        """The chat format's stop ids and the client's (any invalid value is left for ``SamplingParams`` to
        refuse, naming the field)."""
        family = self._family_stops
        if asked is None:
            return tuple(sorted(family))
        if isinstance(asked, list | tuple) and all(isinstance(i, int) for i in asked):
            return tuple(sorted(family | set(asked)))
        return asked

    @property
    def _appends(self) -> bool:
        return self.render_mode is RenderMode.APPEND

    def refuse_surely_too_long(self, chars: int) -> None:
        """A prompt whose text to tokenize (``chars`` characters) alone needs more tokens than the context window
        holds is refused before it is tokenized (``polar.proxy.cost``): a 10 MB body then costs no tokenizing,
        and never a wrong refusal."""
        error = surely_too_long(chars, self.max_token_chars, self.context_length)
        if error is not None:
            raise error

    def bound_bytes(self) -> int:
        """A body of at most this many bytes cannot hold a prompt ``refuse_surely_too_long`` refuses (its decoded
        text is no longer than its bytes); 0 when there is no bound."""
        return self.context_length * self.max_token_chars if self.max_token_chars > 0 else 0

    async def load_history(self, session_id: str) -> SessionHistory:
        return await self._in_store(self.histories.load, session_id)

    @staticmethod
    def _request(plan: CallPlan) -> GenerateRequest:
        return GenerateRequest(
            plan.prompt.ids,
            plan.sampling,
            request_id=plan.meta.completion_id,
            session_id=plan.session.id,
            extras=extras_request(plan.session.capture, plan.prompt),
        )

    def _check(self, plan: CallPlan) -> OutputCheck:
        return OutputCheck(vocab_size=self.vocab_size, max_new_tokens=plan.sampling.max_new_tokens)

    def _timeout(self) -> BackendTimeout:
        return BackendTimeout(f"the backend did not finish the generation within {self.backend_deadline_s:g} s")

    async def _in_store(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread, waited for at most ``store_timeout_s`` (a frozen store is a 503)."""
        try:
            return await asyncio.wait_for(in_thread(fn, *args), self.store_timeout_s)
        except TimeoutError:
            raise StoreError(f"the store did not answer within {self.store_timeout_s:g} s") from None

    # ---- non-streaming ----------------------------------------------------------------------------

    async def complete(self, plan: CallPlan) -> dict[str, Any]:
        slot = await self._slot(plan)  # Overloaded (before any generation) records nothing
        generating = time.perf_counter()
        try:
            try:
                async with asyncio.timeout(self.backend_deadline_s):
                    final = await plan.policy.generate(self._request(plan), plan.context)
            except TimeoutError:
                raise self._timeout() from None
            finally:
                slot()
                generated_s = time.perf_counter() - generating
            self._check(plan).result(final)
        except PolarError as exc:
            await self._record_error(plan, exc)
            raise
        await turn()
        parsed_events = self._parse_all(plan, final.output_ids)
        completion = self._completion(plan, final, parsed_events)
        response = plan.codec.response(completion, request=plan.request)
        await self._record(plan, final, completion, response)
        finished(plan, final, generated_s)
        return response

    async def _slot(self, plan: CallPlan) -> Callable[[], None]:
        """Take one of the inference server's in-flight slots (scripted policies need none); returns its
        release, which may be called more than once. In its turn: a burst of plans each opening a backend call
        in one iteration would hold the loop for all of them."""
        await turn()
        limit = self.limit
        if limit is None or plan.policy.scripted:
            return _nothing
        await limit.acquire()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                limit.release()

        return release

    # ---- shared -----------------------------------------------------------------------------------

    def _parse_all(self, plan: CallPlan, output_ids: Sequence[int]) -> ParsedOutput:
        return self.chat_format.parse(output_ids, plan.request.tools, plan.prompt.ids)

    def _completion(self, plan: CallPlan, final: GenerateResult, parsed: ParsedOutput) -> Completion:
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
        """The request as stored: relative to the parent capture's (db.request_json); the parent's body is
        in memory in the steady state, else rebuilt from the store."""
        parent = plan.prompt.parent
        if parent is None or parent.ref is None:
            return compact_request(plan.body, None)
        parent_body = self.histories.body_in_memory(plan.session.id, parent.ref)
        if parent_body is None:
            parent_body = await self._in_store(self.histories.parent_body, plan.session.id, parent.ref)
        return compact_request(plan.body, parent_body)

    async def _record(
        self, plan: CallPlan, final: GenerateResult, completion: Completion, response: dict[str, Any]
    ) -> int:
        """Commit the capture and make it a known call of the session; returns its id."""
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
        apply_extras(row, final.extras, plan.session.capture)
        row.n_malformed_tool_calls = completion.malformed_tool_calls
        row.scripted = plan.policy.scripted
        row.admission, row.admission_cause = plan.admission.admission.value, plan.admission.cause
        committing = time.perf_counter()
        stored = await self.writer.store(row, timeout_s=self.store_timeout_s, key_hash=plan.session.key_hash)
        metrics.COMMIT_WAIT.observe(time.perf_counter() - committing)
        await turn()  # a group commit wakes its whole batch at once
        capture_id = stored.id
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
                seq=stored.seq,
            ),
            plan.prompt.ids,
        )
        return capture_id

    def undelivered(self, plan: CallPlan, capture_id: int) -> None:
        """The committed reply ``capture_id`` never reached its caller: marked ``UNACKNOWLEDGED`` (never trained)
        and dropped from the session's history (never a parent)."""
        self.writer.unacknowledge(capture_id)
        self.histories.drop(plan.session.id, capture_id)

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
                error=f"{error.error_type}: {error.message}".replace("\x00", "\\x00"),  # a text column
            )
            row.scripted = plan.policy.scripted
            row.admission, row.admission_cause = plan.admission.admission.value, plan.admission.cause
            stored = await self.writer.store(row, timeout_s=self.store_timeout_s, key_hash=plan.session.key_hash)
            self.histories.note_seq(plan.session.id, stored.seq)
        except PolarError:
            log.warning("could not record the failed call of session %s", plan.session.id)


def _nothing() -> None:
    return None
