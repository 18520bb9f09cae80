"""The gateway's parts, wired once: sessions, policies, prompt building, the call pipeline, capture writes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from db import make_engine, make_session_factory, migrate
from polar import metrics
from polar.chat import ChatFormat, chat_format_for
from polar.inference import Backend
from polar.proxy.call.generation import Generation
from polar.proxy.call.intake import Intake
from polar.proxy.call.limits import ServerLimits, servers_of
from polar.proxy.call.plan import Planner
from polar.proxy.call.policy import BackendPolicy, Policy, ScriptedPolicy
from polar.proxy.call.record import CallRecorder
from polar.proxy.call.screen import BodyScreen
from polar.proxy.call.service import CallService
from polar.proxy.capture.writer import CaptureWriter
from polar.proxy.session.history import HistoryCache
from polar.proxy.session.sessions import SessionInfo, SessionStore
from polar.settings import Settings
from polar.store_bound import in_store
from polar.tokens.messages import Message
from polar.tokens.offload import TokenizerChild
from polar.tokens.render import PromptBuilder
from polar.tokens.tokenizer import ChatTokenizer
from polar.wire import get_codec
from polar.wire.base import parse_after
from polar.wire.body_digest import body_digest
from polar.wire.canonical import ChatRequest
from polar.wire.json_guard import JsonLimits
from polar.wire.policy import ScriptedPolicySpec

if TYPE_CHECKING:  # torch, imported by the engine, is not loaded by a gateway that never scores
    from polar.models.engine import LocalEngine

T = TypeVar("T")
log = logging.getLogger(__name__)


class Gateway:
    def __init__(
        self,
        settings: Settings,
        factory: sessionmaker[Session],
        backend: Backend,
        tokenizer: ChatTokenizer,
        scorer: LocalEngine | None = None,
        *,
        owns_backend: bool = True,
        owns_store: bool = False,
        model_dir: Path | None = None,
        chat_format: ChatFormat,
        model_name: str = "",
    ):
        """``owns_store``: ``factory``'s engine is this gateway's (``create`` made it), disposed by ``aclose``;
        ``model_dir``: the model folder ``tokenizer`` came from (scripted policies score with its weights);
        ``chat_format``: its family's format, which alone decides rendering and parsing; ``model_name``: the
        served model's name (``/v1/models``)."""
        self.settings = settings
        self.factory = factory
        self._owns_store = owns_store
        self.backend = backend
        self.tokenizer = tokenizer
        self.chat_format = chat_format
        self.model_name = model_name or settings.model
        self.histories = HistoryCache(factory, self._decode_request, self._parse_reply)
        self.sessions = SessionStore(
            factory, ttl_s=settings.session_cache_ttl_s, on_key=self.histories.bind_key, on_stale=self._recheck_soon
        )
        self._rechecking: asyncio.Task[None] | None = None
        self.writer = CaptureWriter(factory)
        self.writer.observe_commit = metrics.observe_commit
        self.builder = PromptBuilder(tokenizer, chat_format=chat_format)
        self.limits = JsonLimits(max_depth=settings.max_json_depth, max_string_chars=settings.max_string_chars)
        store_timeout_s = settings.store_statement_timeout_s
        planner = Planner(
            builder=self.builder,
            chat_format=chat_format,
            histories=self.histories,
            context_length=backend.context_length,
            default_max_tokens=settings.default_max_tokens,
            render_mode=settings.render_mode,
            max_token_chars=max(len(tokenizer.id_to_token(i) or "") for i in range(tokenizer.vocab_size)),
            store_timeout_s=store_timeout_s,
        )
        servers, route = servers_of(backend, settings.backend_url)
        limit = ServerLimits(
            backend.name, servers, route, settings.backend_max_in_flight, settings.backend_queue_timeout_s
        )
        self.screen = BodyScreen()  # over-size bodies decoded in a child process (started on the first)
        # Long texts tokenized in a child process (started on the first): their ids never hold this one's loop.
        self._tokenize_child: TokenizerChild | None = None
        if settings.tokenize_child_min_chars and tokenizer.offload is None:
            child = TokenizerChild(tokenizer.to_json(), min_chars=settings.tokenize_child_min_chars)
            self._tokenize_child = tokenizer.offload = child
        self.calls = CallService(
            intake=Intake(
                self.sessions, self.histories, planner, self.limits, store_timeout_s=store_timeout_s, screen=self.screen
            ),
            planner=planner,
            generation=Generation(chat_format, tokenizer.vocab_size, settings.backend_deadline_s, limit),
            recorder=CallRecorder(self.writer, self.histories, store_timeout_s=store_timeout_s),
            builder=self.builder,
            policy_for=self.policy_for,
        )
        self._backend_policy = BackendPolicy(backend)
        self._scorer = scorer
        self._policies: dict[str, Policy] = {}
        self._owns_backend = owns_backend
        self.model_dir = model_dir

    @classmethod
    async def create(cls, settings: Settings, backend: Backend | None = None) -> Gateway:
        """Load the model folder's tokenizer and chat format, connect the configured backend and check that the
        two agree, then migrate the store. Bad configuration raises ConfigError before anything serves."""
        from polar.backends.registry import make_backend
        from polar.model_folder import folder_tokenizer
        from polar.models.check import check_tokenizer_against_server
        from polar.models.resolve import ModelChoice, resolve_model_folder

        choice = ModelChoice.policy(settings)
        folder = await asyncio.to_thread(resolve_model_folder, choice)
        tokenizer = folder_tokenizer(folder)  # a folder without a usable tokenizer fails before the backend starts
        # The family (from the folder, or POLAR_CHAT_FORMAT) decides the prompt and tool-call syntax.
        chat_format = await asyncio.to_thread(chat_format_for, folder, settings.chat_format)
        owns_backend = backend is None
        backend = backend or await make_backend(settings)
        try:
            for url in choice.backend_urls:  # every server of a fleet serves the same model
                await asyncio.to_thread(check_tokenizer_against_server, tokenizer, url)
            url = settings.resolved_database_url
            await asyncio.to_thread(migrate.upgrade, url)
        except BaseException:
            if owns_backend:
                await backend.aclose()
            raise
        engine = make_engine(
            url,
            connect_timeout_s=settings.store_connect_timeout_s,
            statement_timeout_s=settings.store_statement_timeout_s,
        )
        factory = make_session_factory(engine)
        return cls(
            settings,
            factory,
            backend,
            tokenizer,
            owns_backend=owns_backend,
            owns_store=True,
            model_dir=folder.path,
            chat_format=chat_format,
            model_name=settings.served_model_name or choice.served_name(folder),
        )

    def _decode_request(
        self, protocol: str, body: dict[str, Any], model: str, prior: tuple[Any, ChatRequest] | None = None
    ) -> ChatRequest:
        """A stored request, decoded again (captures written by another process or before a restart); with
        ``prior`` (its parent's body and decode) only what it adds is decoded."""
        known = None
        if prior is not None:
            own, parent = body_digest(body), body_digest(prior[0])
            known = (own.repeats(parent), prior[1]) if own is not None and parent is not None else None
        return parse_after(get_codec(protocol), body, known, path_model=model, path_stream=False)

    def _parse_reply(self, output_ids: Sequence[int], prompt_tail: Sequence[int] = ()) -> Message:
        """A stored reply, parsed again; ``prompt_tail`` ends with the generation prompt it was sampled after
        (a family whose generation prompt opens a channel, gpt-oss's analysis, parses by it)."""
        return self.chat_format.parse(output_ids, (), list(prompt_tail) or None).message()

    async def in_store(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (a blocking store call) in a worker thread, bounded by the statement timeout (a 503)."""
        return await in_store(fn, *args, timeout_s=self.settings.store_statement_timeout_s)

    def _recheck_soon(self) -> None:
        """A cached key went stale (``SessionStore.cached``, on the loop): one task at a time rechecks the queued
        keys, a batch per store read, until none is left."""
        if self._rechecking is None or self._rechecking.done():
            self._rechecking = asyncio.get_running_loop().create_task(self._recheck_keys())

    async def _recheck_keys(self) -> None:
        while True:
            try:
                if not await self.in_store(self.sessions.recheck):
                    return
            except Exception as exc:  # noqa: BLE001 -- the keys stay queued (and trusted; the writer still checks each at commit)
                log.warning("rechecking cached session keys failed (%s); trying again", exc)
                await asyncio.sleep(max(self.settings.session_cache_ttl_s, 1.0))

    def policy_for(self, session: SessionInfo) -> Policy:
        """The backend, or the session's scripted policy (scored by the local model)."""
        if not session.policy:
            return self._backend_policy
        if session.id not in self._policies:
            if self._scorer is None:
                from polar.backends.registry import scripted_scorer

                self._scorer = scripted_scorer(self.settings, self.backend, self.model_dir)
            spec = ScriptedPolicySpec.parse(session.policy)
            self._policies[session.id] = ScriptedPolicy(spec, self._scorer, self.chat_format)
        return self._policies[session.id]

    async def aclose(self) -> None:
        if self._rechecking is not None:
            self._rechecking.cancel()
            await asyncio.gather(self._rechecking, return_exceptions=True)
        self.writer.close()
        await self.screen.aclose()
        child = self._tokenize_child
        if child is not None:
            if self.tokenizer.offload is child:
                self.tokenizer.offload = None
            await asyncio.to_thread(child.close)
        if self._owns_backend:
            await self.backend.aclose()
        if self._owns_store:
            # Its pooled connections close now, not when the engine is collected (psycopg warns of an open one).
            await asyncio.to_thread(self.factory.kw["bind"].dispose)
