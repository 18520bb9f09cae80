"""Bubblewrap confinement for the local runtime: which host files a command may see.

A confined command starts in an empty root file system holding only:

- the runtime's own folder, read-write (its work folder, ``HOME``, ``TMPDIR``, logs, the launcher's exit file);
- the tools folder (``POLAR_TOOLS``: the agent CLIs and Node), read-only;
- the interpreter harnesses and evaluators get as ``{python}``: this process's virtual environment and the base
  Python it was made from, and the source of the ``polar`` and ``harness_adapters`` packages (the built-in agent
  is ``python -m harness_adapters.polar_agent``), read-only;
- what a program needs to run: ``/usr``, ``/bin``, ``/sbin``, ``/lib*`` read-only, and of ``/etc`` only
  ``ETC_ENTRIES`` (users, name resolution, the dynamic linker, certificates, alternatives; never ``shadow``,
  ``gitconfig``, ``ssh``, or anything else);
- a private ``/tmp``, its own ``/proc`` (its own PID namespace) and a minimal ``/dev``.

Everything else is absent, not merely read-only: ``/root``, ``/home``, ``/work``, ``POLAR_HOME`` (the store's
SQLite file, the control token, other rollouts' folders). The network is shared on purpose: the harness must
reach the gateway on loopback.

``isolation_for`` decides what a runtime gets: ``bwrap`` needs bubblewrap to work here and refuses otherwise;
``auto`` (the default) uses it when it works and falls back to running on the host with a warning logged once.
Whether it works is checked once per process by running it with the namespaces the runtime asks for (an
installed ``bwrap`` may still be refused by the kernel or a container's seccomp profile).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from polar.errors import SandboxError
from polar.settings import Isolation

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("polar", "harness_adapters")  # what the built-in agent imports, from an editable install's source
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_ENTRIES = (
    "passwd",
    "group",
    "hosts",
    "host.conf",
    "resolv.conf",
    "nsswitch.conf",
    "gai.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "localtime",
    "os-release",
    "mime.types",
)
NAMESPACES = ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "polar-sandbox", "--die-with-parent")
PROBE_TIMEOUT_S = 30.0


@functools.cache
def bwrap_problem() -> str | None:
    """None when bubblewrap confines commands on this machine; otherwise why not. Run once per process."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap (the bwrap command) is not installed"
    probe = [exe, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", *NAMESPACES, "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not be run: {exc}"
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip()[-300:] or f"exit code {done.returncode}"
        return f"bwrap does not work here: {reason}"
    return None


def bwrap_available() -> bool:
    return bwrap_problem() is None


@functools.cache
def _warn_fallback(reason: str) -> None:
    log.warning(
        "POLAR_RUNTIME_ISOLATION=auto: %s; local runtimes run commands on the host, which can read every host "
        "file this process can (install bubblewrap, or set POLAR_RUNTIME_ISOLATION=none to accept it)",
        reason,
    )


def isolation_for(requested: Isolation) -> Isolation:
    """``BWRAP`` or ``NONE``: what a local runtime asked for ``requested`` gets on this machine."""
    if requested is Isolation.NONE:
        return Isolation.NONE
    problem = bwrap_problem()
    if problem is None:
        return Isolation.BWRAP
    if requested is Isolation.BWRAP:
        raise SandboxError(f"runtime isolation 'bwrap': {problem}")
    _warn_fallback(problem)
    return Isolation.NONE


def _system() -> list[str]:
    args: list[str] = []
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):  # merged /usr: /bin -> usr/bin stays a link
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    for entry in ETC_ENTRIES:
        args += ["--ro-bind-try", f"/etc/{entry}", f"/etc/{entry}"]
    return args


def host_paths(tools_dir: Path | None) -> list[Path]:
    """The host folders a confined command sees read-only besides the system: tools, interpreter, packages."""
    paths = [Path(sys.prefix), Path(sys.base_prefix), *(REPO_ROOT / name for name in PACKAGES)]
    if tools_dir is not None:
        paths.append(Path(tools_dir).expanduser())
    return [path for path in paths if path.is_dir()]


def _under_system(path: Path) -> bool:
    return any(path == Path(folder) or path.is_relative_to(folder) for folder in SYSTEM_DIRS)


def _read_only(paths: Iterable[Path]) -> list[str]:
    """Each path at its own name and at its resolved one (a harness may be told either), parents first."""
    targets: dict[str, str] = {}
    for path in paths:
        absolute, real = Path(os.path.abspath(path)), path.resolve()
        for seen_as in (absolute, real):
            if not _under_system(seen_as):
                targets.setdefault(str(seen_as), str(real))
    args: list[str] = []
    for target in sorted(targets, key=lambda t: (t.count("/"), t)):
        args += ["--ro-bind", targets[target], target]
    return args


def confine(argv: Sequence[str], *, root: Path, cwd: Path, tools_dir: Path | None) -> list[str]:
    """``argv`` under bubblewrap, seeing only what this module's docstring lists."""
    return [
        "bwrap",
        *_system(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        # After the private /tmp, so a checkout, virtualenv or runtime folder under /tmp (CI's) is visible.
        *_read_only(host_paths(tools_dir)),
        "--bind",
        str(root),
        str(root),
        *NAMESPACES,
        "--chdir",
        str(cwd),
        "--",
        *argv,
    ]
