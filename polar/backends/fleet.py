"""The fleet backend: several inference servers (``POLAR_BACKEND_URL=http://a:30000,http://b:30000``) as one Backend.

Routing. A generation goes to the server that ranks first for its session under rendezvous hashing
(highest ``blake2b(session_id, url)``): every gateway replica picks the same server for a session without
talking to the others, so the session's growing prompt hits that server's prefix cache, and removing or adding a
server moves only the sessions that ranked it first. A request without a session id hashes on its request id.

Failover. A server that cannot be reached, times out, or answers a 5xx is skipped for
``POLAR_BACKEND_RETRY_AFTER_S`` and the request goes to the next server in the session's ranking; nothing had
been sent to the caller yet, so the generation simply happens there. A stream that fails after its first
chunk fails (its tokens already left); the server is still marked down, so the caller's retry moves. The
session then stays on the next server until the first one answers again. Every result names the server that
produced it (``GenerateResult.server``, stored on the capture), so a move is recorded in the captures: the
``server`` of consecutive captures of the session differs; the fleet also counts and logs each move.

Weights. ``update_weights`` goes to every server at once. Servers that failed (or were down) are marked
stale and get the latest update before they serve again, as does a server coming back whose weight version is
not the fleet's; a push that did not reach every server raises ``BackendError`` naming the ones it missed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace

from polar.errors import BackendError, BackendUnavailable, InvalidRequest, PolarError
from polar.inference import Backend, GenerateChunk, GenerateRequest, GenerateResult, WeightUpdate

log = logging.getLogger(__name__)
Connect = Callable[[str], Awaitable[Backend]]
REMEMBERED_SESSIONS = 50_000  # the last server of this many sessions is kept to notice moves


def parse_urls(value: str) -> list[str]:
    """The comma-separated server list of ``POLAR_BACKEND_URL``: trimmed, no empties, no duplicates."""
    urls = [part.strip().rstrip("/") for part in value.split(",") if part.strip()]
    if not urls:
        raise InvalidRequest("POLAR_BACKEND_URL names no server", field="backend_url")
    if len(set(urls)) != len(urls):
        raise InvalidRequest(f"POLAR_BACKEND_URL lists a server twice: {value!r}", field="backend_url")
    return urls


def server_failed(exc: BaseException) -> bool:
    """The server, not the request, is at fault: unreachable, timed out, or a 5xx without a protocol error."""
    return isinstance(exc, BackendUnavailable) or type(exc) is BackendError


@dataclass
class Member:
    url: str
    backend: Backend | None = None
    down_until: float = 0.0
    stale: bool = False  # may not hold the fleet's weights: checked (and updated) before it serves
    served: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class FleetBackend:
    """One Backend over several servers of one kind (each built by ``connect``)."""

    def __init__(
        self,
        members: Sequence[Member],
        connect: Connect,
        *,
        retry_after_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not members:
            raise InvalidRequest("a fleet needs at least one server", field="backend_url")
        self.members = list(members)
        self._connect = connect
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._target: WeightUpdate | None = None  # the latest update pushed to the fleet
        self._last_server: OrderedDict[str, str] = OrderedDict()
        self.moves = 0
        # The members' kind (sglang, vllm): captures and /health name the backend as with one server.
        self.name = next((m.backend.name for m in self.members if m.backend is not None), "fleet")

    @classmethod
    async def connect(cls, urls: Sequence[str], connect: Connect, *, retry_after_s: float = 10.0) -> FleetBackend:
        """Connect every server; those that fail are down for now and tried again later. At least one must answer."""
        members = [Member(url) for url in urls]
        fleet = cls(members, connect, retry_after_s=retry_after_s)
        results = await asyncio.gather(*(connect(url) for url in urls), return_exceptions=True)
        failures = []
        for member, result in zip(members, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, PolarError):
                    await fleet.aclose()
                    raise result
                failures.append(f"{member.url}: {result.message}")
                fleet._down(member, result)
            else:
                member.backend = result
        if all(m.backend is None for m in members):
            raise BackendUnavailable("no server of the fleet answered: " + "; ".join(failures))
        fleet.name = next(m.backend.name for m in members if m.backend is not None)
        return fleet

    # ---- the Backend protocol ---------------------------------------------------------------------

    @property
    def context_length(self) -> int:
        return min(m.backend.context_length for m in self.members if m.backend is not None)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        failures: list[str] = []
        for member in self._candidates(self.ranking(request)):
            backend = await self._usable(member)
            if backend is None:
                continue
            try:
                result = await backend.generate(request)
            except PolarError as exc:
                if not server_failed(exc):
                    raise
                failures.append(f"{member.url}: {exc.message}")
                self._down(member, exc)
                continue
            return self._served(request, member, result)
        raise self._none_answered(failures)

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        failures: list[str] = []
        for member in self._candidates(self.ranking(request)):
            backend = await self._usable(member)
            if backend is None:
                continue
            chunks = backend.stream(request)
            try:
                first = await anext(chunks, None)
            except PolarError as exc:
                await _aclose(chunks)
                if not server_failed(exc):
                    raise
                failures.append(f"{member.url}: {exc.message}")
                self._down(member, exc)
                continue
            except BaseException:
                await _aclose(chunks)
                raise
            break
        else:
            raise self._none_answered(failures)
        try:
            chunk = first
            while chunk is not None:
                if chunk.final is not None:
                    chunk = replace(chunk, final=self._served(request, member, chunk.final))
                yield chunk
                chunk = await anext(chunks, None)
        except PolarError as exc:
            if server_failed(exc):
                self._down(member, exc)
            raise
        finally:
            await _aclose(chunks)

    async def weight_version(self) -> str:
        """The weight version of the first server that answers (all hold the same once updates are applied)."""
        failures: list[str] = []
        for member in self._candidates(self.members):
            backend = await self._usable(member)
            if backend is None:
                continue
            try:
                return await backend.weight_version()
            except PolarError as exc:
                if not server_failed(exc):
                    raise
                failures.append(f"{member.url}: {exc.message}")
                self._down(member, exc)
        raise self._none_answered(failures)

    async def update_weights(self, update: WeightUpdate) -> None:
        """Push ``update`` to every server at once; the ones it missed get it before they serve again."""
        self._target = update
        results = await asyncio.gather(*(self._push(m, update) for m in self.members), return_exceptions=True)
        missed = []
        for member, result in zip(self.members, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, PolarError):
                    raise result
                member.stale = True
                missed.append(f"{member.url}: {result.message}")
        if missed:
            reached = len(self.members) - len(missed)
            raise BackendError(
                f"weights {update.version} reached {reached} of {len(self.members)} servers; missed "
                + "; ".join(missed)
                + " (each gets them before it serves again)"
            )

    async def aclose(self) -> None:
        for member in self.members:
            if member.backend is not None:
                with suppress(Exception):
                    await member.backend.aclose()
                member.backend = None

    # ---- routing ----------------------------------------------------------------------------------

    def ranking(self, request: GenerateRequest) -> list[Member]:
        """The servers in the order this request tries them: rendezvous hashing on its session (else request) id."""
        return self._ranked(request.session_id or request.request_id or "")

    def _ranked(self, key: str) -> list[Member]:
        raw = key.encode()
        return sorted(self.members, key=lambda m: _score(raw, m.url), reverse=True)

    def server_for(self, key: str) -> str:
        """The URL a request with session (else request) id ``key`` goes to now: the first in its ranking that is
        not skipped after a failure (the gateway counts its in-flight slot there)."""
        return self._candidates(self._ranked(key))[0].url

    def _candidates(self, ranked: Sequence[Member]) -> list[Member]:
        """The members not skipped after a failure, in order; when every one is, all of them (a last try beats
        refusing every call until the first comes back)."""
        now = self._clock()
        up = [m for m in ranked if m.down_until <= now]
        return up or list(ranked)

    def _served(self, request: GenerateRequest, member: Member, result: GenerateResult) -> GenerateResult:
        member.served += 1
        session = request.session_id
        if session is not None:
            before = self._last_server.get(session)
            if before is not None and before != member.url:
                self.moves += 1
                log.warning("session %s moved from %s to %s", session, before, member.url)
            self._last_server[session] = member.url
            self._last_server.move_to_end(session)
            while len(self._last_server) > REMEMBERED_SESSIONS:
                self._last_server.popitem(last=False)
        return replace(result, server=member.url)

    def _down(self, member: Member, exc: PolarError) -> None:
        member.down_until = self._clock() + self.retry_after_s
        member.stale = True  # it may come back restarted, with other weights
        log.warning("inference server %s skipped for %.0f s: %s", member.url, self.retry_after_s, exc.message)

    async def _usable(self, member: Member) -> Backend | None:
        """The member's backend, connected and holding the fleet's weights; None when that fails (it is then down)."""
        async with member.lock:
            try:
                if member.backend is None:
                    member.backend = await self._connect(member.url)
                if member.stale:
                    await self._catch_up(member.backend)
                    member.stale = False
            except PolarError as exc:
                if not server_failed(exc) and member.backend is None:
                    raise
                self._down(member, exc)
                return None
            return member.backend

    async def _catch_up(self, backend: Backend) -> None:
        target = self._target
        if target is not None and await backend.weight_version() != target.version:
            await backend.update_weights(target)

    async def _push(self, member: Member, update: WeightUpdate) -> None:
        async with member.lock:
            if member.backend is None:
                member.backend = await self._connect(member.url)
            await member.backend.update_weights(update)
            member.stale = False

    def _none_answered(self, failures: list[str]) -> BackendUnavailable:
        detail = "; ".join(failures) if failures else "none could be connected"
        return BackendUnavailable(f"no inference server of the fleet answered ({detail})")


def _score(key: bytes, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(key + b"\x00" + url.encode(), digest_size=8).digest(), "big")


async def _aclose(chunks: AsyncIterator[GenerateChunk]) -> None:
    close = getattr(chunks, "aclose", None)
    if close is not None:
        await close()
