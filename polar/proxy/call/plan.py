"""Planning a call: the session's earlier call it extends, its prompt ids, sampling and admission.

Nothing here generates or writes: a plan is everything decided before generation starts. The session's history
comes from memory in the steady state and from the store (only the captures this process lacks) on a session's
first call here, after a seq this process skipped, or when the request holds a reply no known call explains.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from db.enums import Admission
from polar.chat.protocol import ChatFormat
from polar.errors import ContextLengthExceeded, InvalidRequest, NotFound
from polar.ids import random_hex
from polar.inference import SamplingParams
from polar.proxy.call.admission import Verdict, admit
from polar.proxy.call.cost import INLINE_CHARS, CostBound, counted_messages, message_chars, message_tokens
from polar.proxy.call.policy import Policy, PolicyContext
from polar.proxy.session.history import HistoryCache, SessionHistory
from polar.proxy.session.sessions import SessionInfo
from polar.proxy.session.witness import single_out
from polar.settings import RenderMode
from polar.slices import in_thread
from polar.store_bound import in_store
from polar.tokens.messages import Role
from polar.tokens.render import PriorCall, Prompt, PromptBuilder
from polar.wire.base import ProtocolCodec, StreamMeta
from polar.wire.body_digest import BodyDigest
from polar.wire.canonical import ChatRequest
from polar.wire.json_guard import CutBody, whole_value

MAX_MODEL_NAME = 256  # the width of captures.model


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
    admission: Verdict = Verdict(Admission.ROOT)  # how the call enters the capture tree (polar.proxy.call.admission)
    digest: BodyDigest | None = None  # the body's digests (polar.wire.body_digest): its capture is stored by them
    ids_text: tuple[bytes, ...] | None = None  # the prompt's ids as JSON, in parts (Line.prompt_text), when known
    cut: CutBody | None = None  # ``body`` lacks the leading messages the session's previous request held

    def whole_body(self) -> Any:
        """The body with every message (decoded again when it was ``cut``)."""
        return whole_value(self.body, self.cut)


class _Stale(Exception):
    """The request may extend a call this process has not loaded yet."""


class Planner:
    def __init__(
        self,
        *,
        builder: PromptBuilder,
        chat_format: ChatFormat,
        histories: HistoryCache,
        context_length: int,
        default_max_tokens: int,
        render_mode: RenderMode,
        max_token_chars: int = 0,
        store_timeout_s: float = 30.0,
    ):
        self.builder = builder
        self._family_stops = frozenset(chat_format.stop_ids)  # its end-of-turn ids: sent with every generation
        self.histories = histories
        self.context_length = context_length
        self.default_max_tokens = default_max_tokens
        self.render_mode = render_mode
        self.max_token_chars = max_token_chars
        # The cost bound (polar.proxy.call.cost); the template's per-message tokens measured once, here.
        self.bound = CostBound(max_token_chars, context_length, message_tokens(builder) if max_token_chars > 0 else 0)
        self.store_timeout_s = store_timeout_s

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
        rendered = messages[found[1] if found is not None and only_new else 0 :]
        chars = message_chars(rendered)
        if found is None or not only_new:
            chars += tools_chars
        self.bound.refuse(chars, counted_messages(rendered))
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
        digest: BodyDigest | None,
        cut: CutBody | None = None,
    ) -> CallPlan:
        """The prompt ids (tokenizing: a whole conversation when no earlier call is extended) and the plan."""
        witnessed = False
        if found is not None:  # a retry's siblings echoed alike: the ids the harness sent back pick one
            same_depth = history.same_depth(len(found[0].messages))
            found, witnessed = single_out(found, request.messages, request.tools, same_depth)
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
        first = history.next_seq == 0 and not history.ahead and not history.nodes and not history.cut
        verdict = admit(
            request.messages,
            request.tools,
            found,
            history.known_calls,
            first=first,
            witnessed=witnessed,
            cut=history.cut,
        )
        return CallPlan(
            session,
            codec,
            body,
            request,
            prompt,
            sampling,
            policy,
            context,
            meta,
            started,
            verdict,
            digest,
            _prompt_text(history, prompt),
            cut,
        )

    async def plan(
        self,
        session: SessionInfo,
        codec: ProtocolCodec,
        body: Any,
        request: ChatRequest,
        policy: Policy,
        started: float | None = None,
        *,
        tools_chars: int = 0,
        digest: BodyDigest | None = None,
        cut: CutBody | None = None,
    ) -> CallPlan:
        """``plan`` with the session's history: from memory in the steady state, read from the store (only the
        captures this process lacks) on a session's first call here, after a seq this process skipped, or
        when the request holds a reply no known call explains. A build that tokenizes little (an append-mode
        extension by a few messages, a short conversation rendered whole) is planned on the event loop, one piece of
        work among others; a long text in a worker thread. (Not every build: Python work in threads competes with
        the loop for the GIL, and a thousand first calls rendered in threads starved it for tens of milliseconds
        at a time.) ``tools_chars``: the characters of the request's tool definitions (``polar.proxy.call.cost``), which
        count towards that when the build renders them. ``digest``: the body's (``polar.wire.body_digest``); ``cut``:
        what ``body`` lacks (``json_guard.CutBody``)."""
        history = self.histories.cached(session.id)
        fresh = history is None
        if history is None:
            history = await self.load_history(session.id)
        try:
            found, chars = self._parent(session, request, history, fresh, tools_chars)
        except _Stale:
            history = await self.load_history(session.id)
            found, chars = self._parent(session, request, history, True, tools_chars)
        args = (session, codec, body, request, policy, history, found, started, digest, cut)
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

    @property
    def builds_on_history(self) -> bool:
        """Whether a call extending an earlier one renders only its new messages: then a request may be decoded
        on top of the session's last one, its earlier messages sealed (``polar.tokens.render.SealedText``)."""
        return self._appends and self.builder.tokenizes_only_new_messages

    async def load_history(self, session_id: str) -> SessionHistory:
        return await in_store(self.histories.load, session_id, timeout_s=self.store_timeout_s)


def _prompt_text(history: SessionHistory, prompt: Prompt) -> tuple[bytes, ...] | None:
    """The prompt's ids as JSON from the session's line when it extends the line's tip (``Line.prompt_text``): the
    backend then sends the line's text, encoded a turn at a time, and encodes only the new ids."""
    if prompt.parent is None:
        return None
    with history.lock:
        return history.line.prompt_text(prompt.parent.ref, prompt.prefix_len, prompt.ids)
