"""Over-size bodies screened in a process of their own, so that refusing one never holds the gateway's loop.

A body larger than the cost bound's byte limit (``CostBound.bound_bytes``) is likely refused: 100,000 tool
definitions, an 8 MiB description. Deciding so means decoding it, and in the gateway's process that holds the
interpreter lock whichever thread does it: orjson builds a million objects in one call (60 ms for 13 MB) and
freeing them takes as long, while the event loop waits for the lock after each socket operation; with two such
bodies in a loop ``/health/live`` took 250-735 ms (``benchmarks/bench_big_tools.py``, 2 cores).

``BodyScreen.check`` sends the body to one child process (``python -m polar.proxy.call.screen``, started on the
first over-size body and kept), which applies the checks ``Intake.decode`` applies to such a body, by the same
function (``polar.proxy.call.decode.decode_body``: the cost bound on the body's shape, JSON limits, the protocol's
validation, the cost bound on its text) and answers with the refusal or
with nothing. A refusal is raised here as the very ``PolarError`` the gateway would have raised itself; a body
that passes is then decoded by the gateway as any large body (a worker thread), so it is decoded twice, which
only bodies that are both over the bound and valid pay (images, escapes). If the child dies or does not answer
within ``SCREEN_TIMEOUT_S`` the body is decoded by the gateway as before (slower for the others, never wrong),
and a new child is started for the next one.

Wire between the two (pipes; the child trusts its parent): a request is ``>II`` (lengths) + pickled
``ScreenRules`` + the raw body; a reply is ``>I`` + a pickled ``(class, args, attributes)`` of the refusal, or
of ``None``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.collector import collector_paused
from polar.errors import PolarError
from polar.proxy.call.cost import CostBound
from polar.proxy.call.decode import decode_body
from polar.wire import get_codec
from polar.wire.json_guard import JsonLimits

log = logging.getLogger(__name__)

SCREEN_TIMEOUT_S = 30.0  # far above any real decode (13 MB: 0.1 s); past it the child is taken to be stuck
_REQUEST = struct.Struct(">II")
_REPLY = struct.Struct(">I")
Refusal = tuple[type[PolarError], tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class ScreenRules:
    """What an over-size body is checked against: its protocol, the gateway's JSON limits and cost bound, and where
    the body came from (the path's model and stream flag)."""

    codec: str
    limits: JsonLimits
    bound: CostBound
    path_model: str | None = None
    path_stream: bool | None = None
    count: bool = False  # a token-count body (its protocol's defaults fill what it lacks)


def screen(raw: bytes, rules: ScreenRules) -> None:
    """Raises the ``PolarError`` that decoding ``raw`` under ``rules`` gives (a malformed body, or one that surely
    exceeds the context window); returns when the body passes."""
    codec = get_codec(rules.codec)
    decode_body(
        raw,
        codec,
        rules.limits,
        rules.bound,
        path_model=rules.path_model,
        path_stream=rules.path_stream,
        count=rules.count,
        whole_bound=True,
    )


class BodyScreen:
    """The gateway's side: one child at a time, one body at a time through it (bodies queue on a lock)."""

    def __init__(self, timeout_s: float = SCREEN_TIMEOUT_S):
        self.timeout_s = timeout_s
        self._child: asyncio.subprocess.Process | None = None
        self._lock: asyncio.Lock | None = None
        self.screened = 0  # bodies the child answered for
        self.failed = 0  # bodies it did not (decoded by the gateway instead)

    async def check(self, raw: bytes, rules: ScreenRules) -> None:
        """Raises the refusal for ``raw`` (decoded in the child); returns when it passes or could not be screened."""
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            try:
                refusal = await asyncio.wait_for(self._ask(raw, rules), self.timeout_s)
            except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError, pickle.UnpicklingError) as exc:
                self.failed += 1
                log.warning("screening a %d-byte body failed (%r); the gateway decodes it itself", len(raw), exc)
                await self._stop()
                return
        self.screened += 1
        if refusal is not None:
            cls, args, attributes = refusal
            error = cls.__new__(cls)
            error.args = args
            error.__dict__.update(attributes)
            raise error

    async def _ask(self, raw: bytes, rules: ScreenRules) -> Refusal | None:
        child = await self._started()
        assert child.stdin is not None and child.stdout is not None
        encoded = pickle.dumps(rules)
        child.stdin.write(_REQUEST.pack(len(encoded), len(raw)) + encoded)
        child.stdin.write(raw)
        await child.stdin.drain()
        (size,) = _REPLY.unpack(await child.stdout.readexactly(_REPLY.size))
        refusal: Refusal | None = pickle.loads(await child.stdout.readexactly(size))
        return refusal

    async def _started(self) -> asyncio.subprocess.Process:
        if self._child is None or self._child.returncode is not None:
            # the child imports this package from where the gateway did (a checkout on PYTHONPATH, or installed)
            root = str(Path(__file__).resolve().parents[3])
            path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
            self._child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                __name__,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": path},
            )
        return self._child

    async def _stop(self) -> None:
        child, self._child = self._child, None
        if child is None or child.returncode is not None:
            return
        if child.stdin is not None:
            child.stdin.close()  # the child leaves at the end of its input
        try:
            await asyncio.wait_for(child.wait(), 2.0)
        except TimeoutError:
            child.kill()
            await child.wait()

    async def aclose(self) -> None:
        await self._stop()


def _serve() -> None:
    """The child: screens bodies from stdin until it ends (the gateway closed it, or died)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the gateway; it closes stdin in turn
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    while header := source.read(_REQUEST.size):
        rules_size, body_size = _REQUEST.unpack(header)
        rules: ScreenRules = pickle.loads(source.read(rules_size))
        raw = source.read(body_size)
        refusal: Refusal | None = None
        with collector_paused():  # a million containers, freed by reference counting; never walked
            try:
                screen(raw, rules)
            except PolarError as exc:
                refusal = (type(exc), exc.args, dict(exc.__dict__))
        del raw
        reply = pickle.dumps(refusal)
        sink.write(_REPLY.pack(len(reply)) + reply)
        sink.flush()


if __name__ == "__main__":
    _serve()
