"""The ``local`` runtime: commands run as subprocesses of this machine in a per-rollout folder tree.

Each command gets a clean environment (a harness never sees the pipeline's own variables, such as the database
URL): ``PATH`` with this interpreter's folder first, ``HOME`` and ``TMPDIR`` inside the runtime, loopback kept
off any HTTP proxy, then the task's runtime ``env``, then the caller's. Commands start in a new session, and
their whole process group is killed when they end, time out or are cancelled. They also get SIGTERM when this
process dies (a parent-death signal, set by ``setpriv`` from util-linux), which the harness launcher
(``polar.runtime.launcher``) turns into SIGKILL of its whole group: a killed worker leaves no harness running.

Isolation ``bwrap`` wraps each command in bubblewrap (``polar.runtime.bwrap``): the command sees only its
runtime's folder (read-write), the tools folder, the interpreter and the system folders a program needs
(read-only); the rest of the host (``/root``, ``/home``, ``POLAR_HOME`` with the store and the control token,
other rollouts) is absent. ``/tmp`` is private, the command gets its own PID namespace and dies with its parent.
The network is shared on purpose: the harness must reach the gateway on loopback. ``auto`` (the default) uses
bubblewrap where it works and otherwise runs on the host with a logged warning; ``none`` runs on the host.
Under bubblewrap a command killed by signal N ends with exit code 128+N (bubblewrap's report), not -N.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from polar.errors import SandboxError
from polar.runtime.base import ExecResult, ProcessHandle, RuntimeLayout, SpawnHook
from polar.runtime.bwrap import confine, isolation_for
from polar.settings import Isolation

OUTPUT_TAIL_BYTES = 16_384
"""How much of a command's stdout/stderr an ``ExecResult`` keeps (the full output stays in its log file)."""


def process_start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), None if it is gone (a
    zombie, dead but not yet reaped by whoever inherited it, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; the fields after its last ')' are plain.
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _dies_with_parent(argv: list[str]) -> list[str]:
    """``argv`` under ``setpriv --pdeathsig TERM`` (util-linux): it gets SIGTERM when this process dies.

    An exec'd helper, not a ``preexec_fn``: Python code between fork and exec in a process with threads (the
    engine's, the store's) can deadlock on a lock another thread held at the fork."""
    setpriv = _setpriv()
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else argv


@functools.cache
def _setpriv() -> str | None:
    return shutil.which("setpriv")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - OUTPUT_TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _reason(exc: OSError | shutil.Error) -> str:
    """An OS error's own words (``No space left on device``); copytree's error lists each file's."""
    if isinstance(exc, shutil.Error):
        return (
            "; ".join(str(item[-1]) for item in exc.args[0][:3])
            if exc.args and isinstance(exc.args[0], list)
            else str(exc)
        )
    return exc.strerror or str(exc)


class LocalRuntime:
    kind = "local"

    def __init__(
        self,
        key: str,
        base: Path,
        *,
        env: Mapping[str, str] | None = None,
        isolation: Isolation | None = None,
        tools_dir: Path | None = None,
    ):
        if not key or "/" in key or key.startswith("."):
            raise SandboxError(f"invalid runtime key {key!r}")
        self.key = key
        self.layout = RuntimeLayout.under(Path(base).expanduser().resolve() / key)
        self.env = dict(env or {})
        # The tools folder's Node (harness_adapters.install: the version the pinned CLIs need) goes first on PATH
        # when it is there, ahead of whatever Node this machine has.
        self.tools = Path(tools_dir).expanduser() if tools_dir else None  # visible under bubblewrap
        node_bin = self.tools.resolve() / "node" / "bin" if self.tools else None
        self.node_bin = node_bin if node_bin is not None and (node_bin / "node").is_file() else None
        if isolation is None:  # AUTO for this runtime; the container runtimes built on it confine commands themselves
            isolation = Isolation.AUTO if self.kind == "local" else Isolation.NONE
        self.isolation = isolation_for(isolation)
        self._exec_count = 0

    # ---- lifecycle ----------------------------------------------------------------------------------

    def exists(self) -> bool:
        return all(folder.is_dir() for folder in self.layout.folders())

    async def start(self, *, fresh: bool) -> None:
        if fresh:
            await asyncio.to_thread(shutil.rmtree, self.layout.root, True)
        elif not self.exists():
            raise SandboxError(f"runtime {self.key} has no folder at {self.layout.root} (created on another machine?)")
        for folder in self.layout.folders():
            folder.mkdir(parents=True, exist_ok=True)

    async def stop(self, *, remove: bool) -> None:
        if remove:
            await asyncio.to_thread(shutil.rmtree, self.layout.root, True)

    def interpreter(self, host_python: str) -> str:
        return host_python  # visible under bubblewrap too (polar.runtime.bwrap binds this interpreter)

    async def use_network(self, network: str) -> None:
        if network != "host":
            raise SandboxError(f"the {self.kind} runtime shares the host's network: it cannot run on {network!r}")

    @contextlib.asynccontextmanager
    async def reach(self, url: str) -> AsyncIterator[str]:
        yield url  # the host's network: the gateway is where it is

    async def kill(self, process: ProcessHandle) -> bool:
        if process_start_ticks(process.pid) != process.start_ticks:
            return False  # gone, or the pid now belongs to someone else
        _kill_group(process.pid)
        return True

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "key": self.key, "root": str(self.layout.root), "isolation": self.isolation.value}

    # ---- files --------------------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """``path`` on the host: relative paths are under ``work``; nothing may point outside the root."""
        candidate = Path(path) if os.path.isabs(path) else self.layout.work / path
        resolved = candidate.resolve()
        if resolved != self.layout.root and self.layout.root not in resolved.parents:
            raise SandboxError(f"path {path!r} is outside runtime {self.key}")
        return resolved

    async def write_file(self, path: str, content: str | bytes, *, executable: bool = False) -> Path:
        target = self.resolve(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        try:
            await asyncio.to_thread(target.write_bytes, data)
        except OSError as exc:
            raise SandboxError(f"cannot write {path!r} in runtime {self.key}: {exc.strerror}") from None
        if executable:
            target.chmod(target.stat().st_mode | 0o111)
        return target

    async def read_file(self, path: str) -> bytes:
        target = self.resolve(path)
        try:
            return await asyncio.to_thread(target.read_bytes)
        except OSError as exc:
            raise SandboxError(f"cannot read {path!r} in runtime {self.key}: {exc.strerror}") from None

    async def upload(self, source: Path, target: str) -> None:
        destination = self.resolve(target)
        source = Path(source)
        if not source.exists():
            raise SandboxError(f"cannot upload {source}: it does not exist")
        try:
            destination.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                await asyncio.to_thread(shutil.copytree, source, destination, dirs_exist_ok=True, symlinks=True)
            else:
                await asyncio.to_thread(shutil.copy2, source, destination)
        except (OSError, shutil.Error) as exc:
            raise SandboxError(f"cannot upload {source} to {target!r} in runtime {self.key}: {_reason(exc)}") from None

    async def download(self, source: str, target: Path) -> None:
        origin = self.resolve(source)
        if not origin.exists():
            raise SandboxError(f"cannot download {source!r} from runtime {self.key}: it does not exist")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if origin.is_dir():
                await asyncio.to_thread(shutil.copytree, origin, target, dirs_exist_ok=True, symlinks=True)
            else:
                await asyncio.to_thread(shutil.copy2, origin, target)
        except (OSError, shutil.Error) as exc:
            raise SandboxError(
                f"cannot download {source!r} from runtime {self.key} to {target}: {_reason(exc)}"
            ) from None

    # ---- commands -----------------------------------------------------------------------------------

    def command_env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        interpreter_bin = str(Path(sys.executable).parent)
        if self.node_bin is not None:
            interpreter_bin = f"{interpreter_bin}:{self.node_bin}"
        env = {
            "PATH": f"{interpreter_bin}:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
            "HOME": str(self.layout.home),
            "TMPDIR": str(self.layout.tmp),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            # The gateway is on loopback; an HTTP proxy in the host environment must not intercept it.
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        env.update(self.env)
        env.update(extra or {})
        return env

    def _argv(self, command: str | Sequence[str], cwd: Path) -> list[str]:
        argv = ["bash", "-c", command] if isinstance(command, str) else [str(part) for part in command]
        if self.isolation is not Isolation.BWRAP:
            return argv
        return confine(argv, root=self.layout.root, cwd=cwd, tools_dir=self.tools)

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
        workdir = self.resolve(cwd) if cwd else self.layout.work
        self._exec_count += 1
        # Output goes to files, never pipes: a background child that inherits a pipe would keep it open after
        # the command exits, and reading it to EOF would then wait for that child.
        stdout_path = stdout_path or self.layout.private / f"exec-{self._exec_count}.out"
        stderr_path = stderr_path or self.layout.private / f"exec-{self._exec_count}.err"
        stdout_path.parent.mkdir(parents=True, exist_ok=True)
        stderr_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        timed_out = False
        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            try:
                process = await asyncio.create_subprocess_exec(
                    *_dies_with_parent(self._argv(command, workdir)),
                    cwd=workdir,
                    env=self.command_env(env),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            except OSError as exc:
                raise SandboxError(f"cannot start {command!r} in runtime {self.key}: {exc.strerror}") from None
            try:
                if on_spawn is not None:
                    await on_spawn(ProcessHandle(process.pid, process_start_ticks(process.pid) or 0))
                try:
                    await asyncio.wait_for(process.wait(), timeout_s)
                except TimeoutError:
                    timed_out = True
                    _kill_group(process.pid)
                    await process.wait()
            finally:
                # Leftovers (backgrounded children) go with the command; on cancellation the command goes too.
                _kill_group(process.pid)
                if process.returncode is None:
                    await asyncio.shield(process.wait())
        return ExecResult(
            returncode=None if timed_out else process.returncode,
            stdout=_tail(stdout_path),
            stderr=_tail(stderr_path),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )
