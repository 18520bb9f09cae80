"""The files one ``DockerRuntime.exec`` leaves in the runtime's private folder, and the wrapper that writes them.

The command runs as the leader of a new session (``setsid -w``): the wrapper writes its pid (= its process group)
to one file first, its output to two more and its exit code to a fourth, then kills the group, so nothing the
command started in the background outlives it. The files live on the host (the folder is bind-mounted), so the
runtime reads them without another call into the container.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WRAPPER = 'p=$1 o=$2 e=$3 r=$4; shift 4; echo $$ > "$p"; "$@" </dev/null >"$o" 2>"$e"; echo $? > "$r"; kill -KILL 0'


@dataclass(frozen=True)
class ExecFiles:
    pid: Path
    stdout: Path
    stderr: Path
    rc: Path

    @classmethod
    def make(cls, private: Path, count: int, stdout: Path | None, stderr: Path | None) -> ExecFiles:
        """Unique names in ``private`` (output goes where the caller asked, if it did); their folders made."""
        n = f"{time.monotonic_ns()}-{count}"
        files = cls(
            private / f"exec-{n}.pid", stdout or private / f"exec-{n}.out", stderr or private / f"exec-{n}.err",
            private / f"exec-{n}.rc",
        )  # fmt: skip
        for path in (files.pid, files.stdout, files.stderr):
            path.parent.mkdir(parents=True, exist_ok=True)
        return files

    def wrapped(self, argv: list[str]) -> list[str]:
        """``argv`` run by the wrapper in a new session."""
        files = [str(path) for path in (self.pid, self.stdout, self.stderr, self.rc)]
        return ["setsid", "-w", "sh", "-c", WRAPPER, "polar-exec", *files, *argv]

    def returncode(self) -> int | None:
        """The exit code the wrapper wrote; None when the command was killed before it could."""
        with contextlib.suppress(OSError, ValueError):
            return int(self.rc.read_text())
        return None

    async def group(self, done: asyncio.Future[Any]) -> int | None:
        """The command's process group, once the wrapper wrote it (None if the exec ended before it did)."""
        while not done.done():
            with contextlib.suppress(OSError, ValueError):
                return int(self.pid.read_text())
            await asyncio.sleep(0.01)
        with contextlib.suppress(OSError, ValueError):
            return int(self.pid.read_text())
        return None

    def remove(self) -> None:
        """The bookkeeping files (the output stays: the caller may have named it)."""
        self.pid.unlink(missing_ok=True)
        self.rc.unlink(missing_ok=True)
