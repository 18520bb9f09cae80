"""A call's intake: the caller's session, resolved once and before the body is read; then the body checked and
decoded into a ChatRequest, with the cost bound applied before any tokenization.

An unauthenticated call's body is never read. A large body is decoded in a worker thread, so one big body does
not hold up the event loop (and with it every other session's calls); one over the cost bound's byte limit (likely
refused) is first screened in a process of its own (``polar.proxy.call.screen``), whose refusal costs the
gateway's process no decoding at all. The session's previous request, when it
went the strict way, spares the next one the work on what it repeats (``parse_json_after``, ``parse_after``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from polar.collector import collector_paused
from polar.errors import PolarError
from polar.httpserve.body import OFFLOAD_BYTES
from polar.proxy.call.decode import Decoded, Prior, decode_body
from polar.proxy.call.plan import Planner
from polar.proxy.call.screen import BodyScreen, ScreenRules
from polar.proxy.session.history import HistoryCache, LastRequest
from polar.proxy.session.sessions import SessionInfo, SessionStore
from polar.slices import in_thread
from polar.store_bound import in_store
from polar.wire.base import ProtocolCodec, parse_after
from polar.wire.json_guard import JsonLimits, whole_value

__all__ = ["BodyReader", "Decoded", "Intake"]

BodyReader = Callable[[], Awaitable[bytes]]


class Intake:
    def __init__(
        self,
        sessions: SessionStore,
        histories: HistoryCache,
        planner: Planner,
        limits: JsonLimits,
        *,
        store_timeout_s: float = 30.0,
        screen: BodyScreen | None = None,
    ):
        self.sessions = sessions
        self.histories = histories
        self.planner = planner  # the cost bound: refusals before any tokenization
        self.limits = limits
        self.store_timeout_s = store_timeout_s
        self.screen = screen  # None: over-size bodies are decoded here too (in a worker thread)

    async def session(self, key: str | None) -> SessionInfo:
        """The key's open session: from the process's short-lived cache, else checked against the store."""
        cached = self.sessions.cached(key)
        if cached is not None:
            return cached
        return await in_store(self.sessions.authenticate, key, timeout_s=self.store_timeout_s)

    async def decode(
        self,
        session: SessionInfo,
        read: BodyReader,
        codec: ProtocolCodec,
        model: str | None,
        stream: bool | None,
        *,
        count: bool = False,
    ) -> Decoded:
        """The body read, checked and decoded (``polar.proxy.call.decode``; ``count``: a token-count body, which is
        never remembered).

        Also the cost bound (``polar.proxy.call.cost``): a body whose shape (its counts of messages and tools) or,
        for one over ``CostBound.bound_bytes``, whose rendered text surely needs more tokens than the context window
        is refused with the provider's 400 here, before any tokenization; on its shape, before any work per
        message."""
        raw = await read()
        last = None if count else self._prior(session, codec)
        prior = Prior(last.digest, last.request) if last is not None else None
        bound = self.planner.bound
        big = bool(bound.bound_bytes()) and len(raw) > bound.bound_bytes()
        path_stream = False if count else stream
        if big and self.screen is not None:
            rules = ScreenRules(codec.name, self.limits, bound, model, path_stream, count)
            await self.screen.check(raw, rules)  # raises its refusal; else this process decodes it below

        def decode() -> Decoded:
            if not big:
                return decode_remembered()
            # Likely refused: its million containers are freed, by reference counting, before the collector is
            # back (polar.collector); the refusal leaves without the frames that held them.
            with collector_paused():
                try:
                    return decode_remembered()
                except PolarError as exc:
                    exc.__traceback__ = None
                    raise exc from None

        def decode_remembered() -> Decoded:
            decoded = decode_body(
                raw,
                codec,
                self.limits,
                bound,
                path_model=model,
                path_stream=path_stream,
                count=count,
                prior=prior,
                digests=not count,
                whole_bound=big,
            )
            # The session's latest request, for the next call's decode to build on. Here, where the decode ran (a
            # worker thread for a large body): sealing a long conversation's messages is work per message.
            if not count:
                if decoded.digest is not None:
                    self.histories.remember_request(session.id, codec.name, decoded.digest, decoded.request)
                else:
                    self.histories.forget_request(session.id)
            return decoded

        return await in_thread(_freed_in_thread, decode) if len(raw) >= OFFLOAD_BYTES else decode()

    async def decode_whole(
        self, decoded: Decoded, codec: ProtocolCodec, model: str | None, stream: bool | None
    ) -> Decoded:
        """``decoded``'s body decoded again with nothing taken from the session's history: its earlier messages
        with their text, for a build that renders them (``polar.tokens.render.SealedText``). In a worker thread:
        the whole conversation is converted."""
        body = whole_value(decoded.body, decoded.cut)
        chat = await in_thread(functools.partial(parse_after, codec, body, None, path_model=model, path_stream=stream))
        return Decoded(body, chat, decoded.digest, decoded.tool_chars)

    def _prior(self, session: SessionInfo, codec: ProtocolCodec) -> LastRequest | None:
        """The session's latest request in this codec, if this process holds it and builds on it: a build that
        renders only a request's new messages (nothing is trusted from it: it only says which parts of the new
        body were checked and decoded before)."""
        if not self.planner.builds_on_history:
            return None
        prior = self.histories.last_request(session.id)
        return prior if prior is not None and prior.protocol == codec.name else None


def _freed_in_thread(fn: Callable[[], Decoded]) -> Decoded:
    """``fn()``; a refusal leaves without its traceback, so what its frames held (a decoded body of a million
    objects) is freed here, in the worker thread, not on the event loop where the error is answered."""
    try:
        return fn()
    except PolarError as exc:
        exc.__traceback__ = None
        raise exc from None
