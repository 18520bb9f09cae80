"""The harness launcher: a few lines of POSIX ``sh`` around the harness command, in every runtime.

It runs the harness as its child and, when the harness exits by itself, writes its exit status and end time
into the runtime folder (``<root>/.polar/harness.exit``, JSON ``{"launch", "exit_code", "ended_at"}``; written to
a temporary name and renamed, so a reader never sees half a file). That file outlives the worker: a run whose
harness finished before its worker died is resumed from it (postrun, evaluate, the real reward) instead of being
recorded as interrupted. ``launch`` is the id the run stage recorded before starting it, so a file of an earlier
attempt is never taken for this one.

A harness that is killed (its limit, a cancelled stage) writes nothing. The launcher also turns SIGTERM and
SIGHUP into SIGKILL of its whole process group: the local runtime starts commands with a parent-death signal
(SIGTERM), so when the worker dies, the launcher takes the harness and everything it started with it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from polar.errors import SandboxError
from polar.runtime.base import Runtime

EXIT_FILE = "harness.exit"

# A status above 128 is a harness killed by signal status-128: the launcher then dies by that signal too, so the
# runtime reports the harness's death as its own (exit code -N; 128+N under bubblewrap, which reports a command
# killed by a signal so, as docker does).
SCRIPT = (
    's=$1 l=$2; shift 2; trap "kill -s KILL 0" TERM HUP; "$@" </dev/null & c=$!; wait "$c"; r=$?; '
    'printf \'{"launch": "%s", "exit_code": %d, "ended_at": %s}\\n\' "$l" "$r" "$(date +%s)" > "$s.tmp" '
    '&& mv -f "$s.tmp" "$s"; if [ "$r" -gt 128 ]; then trap - TERM HUP; kill -$((r - 128)) $$; fi; exit "$r"'
)


def exit_path(runtime: Runtime) -> Path:
    return runtime.layout.private / EXIT_FILE


def launcher_argv(argv: Sequence[str], status_path: Path, launch_id: str) -> list[str]:
    """``argv`` run by the launcher, which writes its exit to ``status_path`` (a path valid in the runtime)."""
    return ["sh", "-c", SCRIPT, "polar-launcher", str(status_path), launch_id, *argv]


@dataclass(frozen=True)
class HarnessExit:
    """How a harness ended by itself, as its launcher wrote it."""

    exit_code: int
    ended_at: datetime


def clear_exit(runtime: Runtime) -> None:
    """Remove an earlier attempt's exit file (before a launch)."""
    path = exit_path(runtime)
    path.unlink(missing_ok=True)
    path.with_name(EXIT_FILE + ".tmp").unlink(missing_ok=True)


async def read_exit(runtime: Runtime, launch_id: str) -> HarnessExit | None:
    """The exit the launcher of ``launch_id`` recorded, None if it recorded none (still running, or killed)."""
    if not runtime.exists():
        return None
    try:
        data = json.loads(await runtime.read_file(str(exit_path(runtime))))
    except (SandboxError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("launch") != launch_id:
        return None
    try:
        return HarnessExit(int(data["exit_code"]), datetime.fromtimestamp(float(data["ended_at"]), UTC))
    except (KeyError, TypeError, ValueError):
        return None
