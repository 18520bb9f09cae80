"""Runtimes: where a rollout's commands run (DESIGN §1). ``Runtime`` is the contract (``base``); ``RUNTIMES``
maps a name to a factory and ``open_runtime`` builds one. Built in: ``local`` (a subprocess in a per-rollout
folder with its own ``HOME``, optionally confined with bubblewrap)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from polar.errors import InvalidRequest
from polar.runtime.base import ExecResult, ProcessHandle, Runtime, RuntimeLayout
from polar.runtime.local import LocalRuntime, bwrap_available
from polar.settings import Isolation, Settings

RuntimeFactory = Callable[[Settings, str, Mapping[str, str], Isolation | None], Runtime]


def _local(settings: Settings, key: str, env: Mapping[str, str], isolation: Isolation | None) -> Runtime:
    return LocalRuntime(key, settings.runtime_dir, env=env, isolation=isolation or settings.runtime_isolation)


RUNTIMES: dict[str, RuntimeFactory] = {"local": _local}


def check_runtime(kind: str) -> str:
    if kind not in RUNTIMES:
        raise InvalidRequest(f"unknown runtime {kind!r}; known: {sorted(RUNTIMES)}", field="runtime.type")
    return kind


def open_runtime(
    kind: str,
    settings: Settings,
    key: str,
    *,
    env: Mapping[str, str] | None = None,
    isolation: Isolation | None = None,
) -> Runtime:
    """The runtime ``key`` of kind ``kind`` (not started: call ``start``)."""
    return RUNTIMES[check_runtime(kind)](settings, key, env or {}, isolation)


__all__ = [
    "RUNTIMES",
    "ExecResult",
    "LocalRuntime",
    "ProcessHandle",
    "Runtime",
    "RuntimeLayout",
    "bwrap_available",
    "check_runtime",
    "open_runtime",
]
