"""Containers that stop when the process that made them dies: the docker runtime's parent-death signal.

A container made with ``LIFELINE_COMMAND`` and ``lifeline_options()`` has ``cat`` as its main process, reading a
stdin the engine closes when the first client attached to it goes away (``StdinOnce``, what ``docker run -i``
does). ``hold`` attaches this process to that stdin before the container starts; from then on, when this process
dies, however it dies (kill -9 included), the kernel closes the connection, the engine closes the stdin, ``cat``
exits and the container stops with every process in it. A dead worker's harnesses therefore make no call after it
died, and the container holds nothing else: the runtime's files are on the host.

``release`` closes a container's lifeline (after removing it). At a normal exit the remaining lifelines are
closed, which stops their containers the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import socket
import threading
from typing import Any

LIFELINE_COMMAND = ["cat"]
"""The container's main process: it ends when its stdin does."""

_held: dict[str, Any] = {}
_lock = threading.Lock()


def lifeline_options() -> dict[str, Any]:
    """``containers.create`` arguments for a stdin that closes when its first attached client goes (``detach``
    False is what makes the SDK set ``StdinOnce``; ``create`` never attaches by itself)."""
    return {"stdin_open": True, "detach": False}


def hold(container: Any) -> None:
    """Attach this process to ``container``'s stdin (before ``start``): the container lives at most as long as it."""
    connection = container.attach_socket(params={"stdin": 1, "stream": 1})
    with _lock:
        previous = _held.pop(container.name, None)
        _held[container.name] = connection
    if previous is not None:
        _close(previous)


def release(name: str) -> None:
    """Close the lifeline of the container ``name`` if this process holds one (its container then stops)."""
    with _lock:
        connection = _held.pop(name, None)
    if connection is not None:
        _close(connection)


def held() -> list[str]:
    """The names of the containers whose lifeline this process holds."""
    with _lock:
        return list(_held)


def _close(connection: Any) -> None:
    # The SDK hands back a SocketIO over the hijacked connection, which its response also holds: shut the socket
    # down first (the engine sees the end at once, whatever else still refers to it), then close both.
    raw = getattr(connection, "_sock", None)
    with contextlib.suppress(OSError):
        if raw is not None:
            raw.shutdown(socket.SHUT_RDWR)
    response = getattr(connection, "_response", None)
    with contextlib.suppress(Exception):
        if response is not None:
            response.close()
    with contextlib.suppress(Exception):
        connection.close()


@atexit.register
def _release_all() -> None:
    for name in held():
        release(name)
