"""The runtime contract: a place where a rollout's harness, prepare actions and evaluators run.

A runtime owns one working folder tree (``RuntimeLayout``): ``work`` is the harness's current directory, ``home``
its ``HOME``, ``logs`` and ``artifacts`` what the pipeline keeps. ``exec`` runs one command to completion under
a timeout and kills the command's whole process group when it returns, times out or is cancelled, so nothing a
command started outlives it. Paths given to ``write_file``/``read_file`` are relative to ``work`` unless
absolute, and absolute paths must stay inside the runtime's root.

A runtime is addressed by a key (the rollout id, or ``<rollout id>-eval`` for a fresh evaluation runtime), so a
later stage, or a resumed flow on the same machine, reattaches to it with ``start(fresh=False)``. ``stop``
releases it; the pipeline stops a failed rollout's runtimes (keeping their files) so nothing is left running.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class RuntimeLayout:
    root: Path
    work: Path
    home: Path
    logs: Path
    artifacts: Path
    tmp: Path
    private: Path  # the pipeline's own files (exec output); not meant for the harness

    @classmethod
    def under(cls, root: Path) -> RuntimeLayout:
        return cls(root, root / "work", root / "home", root / "logs", root / "artifacts", root / "tmp", root / ".polar")

    def folders(self) -> tuple[Path, ...]:
        return (self.work, self.home, self.logs, self.artifacts, self.tmp, self.private)


@dataclass(frozen=True)
class ProcessHandle:
    """A spawned process, identified so a later process can tell it from a reused pid (``start_ticks``)."""

    pid: int
    start_ticks: int

    def as_json(self) -> dict[str, int]:
        return {"pid": self.pid, "start_ticks": self.start_ticks}


@dataclass(frozen=True)
class ExecResult:
    """How a command ended. ``returncode`` is None when it was killed for its timeout (``timed_out``)."""

    returncode: int | None
    stdout: str  # the tail of its output
    stderr: str
    timed_out: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def summary(self) -> dict[str, Any]:
        return {"returncode": self.returncode, "timed_out": self.timed_out, "duration_s": round(self.duration_s, 3)}


SpawnHook = Callable[[ProcessHandle], Awaitable[None]]


class Runtime(Protocol):
    kind: str
    key: str
    layout: RuntimeLayout

    def exists(self) -> bool:
        """Whether the runtime's folders are there (a reattach can find them)."""

    async def start(self, *, fresh: bool) -> None:
        """Create the runtime (``fresh``: wiping what a previous attempt left) or reattach to it."""

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
        stdout_path: Path | None = None,
        stderr_path: Path | None = None,
        on_spawn: SpawnHook | None = None,
    ) -> ExecResult:
        """Run ``command`` (a string goes to ``bash -c``) and wait for it, at most ``timeout_s``."""

    async def write_file(self, path: str, content: str | bytes, *, executable: bool = False) -> Path: ...

    async def read_file(self, path: str) -> bytes: ...

    async def upload(self, source: Path, target: str) -> None:
        """Copy a host file or folder to ``target`` in the runtime."""

    async def download(self, source: str, target: Path) -> None:
        """Copy a file or folder of the runtime to the host path ``target``."""

    async def kill(self, process: ProcessHandle) -> bool:
        """Kill ``process``'s group if that very process is still alive (a leftover of a dead flow)."""

    async def stop(self, *, remove: bool) -> None:
        """Release the runtime's resources (processes, a container); ``remove`` also deletes its files."""

    async def use_network(self, network: str) -> None:
        """From now on, commands run on ``network`` (``none`` or ``host``), with the files and state the runtime
        holds kept (the verifier's network: ``evaluator.network``). ``SandboxError`` where the runtime cannot."""

    def reach(self, url: str) -> AbstractAsyncContextManager[str]:
        """Make the HTTP service at ``url`` (the gateway) reachable from the runtime's commands while the context
        is open; yields the URL they must use for it (the same URL where the runtime shares the host's network)."""

    def interpreter(self, host_python: str) -> str:
        """The Python that commands in this runtime get as ``{python}`` (``host_python``: this process's)."""

    def describe(self) -> dict[str, Any]:
        """What to record about the runtime in a rollout's stage results."""
