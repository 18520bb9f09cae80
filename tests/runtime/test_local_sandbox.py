"""The local runtime as a boundary: with default settings (``POLAR_RUNTIME_ISOLATION=auto``) a task's commands run
under bubblewrap and see their own folder, the tools folder, the interpreter and the system folders, but no other
host file: not a secret beside the runtime folder, not ``POLAR_HOME`` (the control token, the store's SQLite
file), not the repository. ``none``, set explicitly, runs on the host and reads them all.

Without a working bubblewrap the boundary tests skip with the reason, except under ``CI=true``, where that is a
failure (``make tools`` installs Debian's ``bubblewrap``: ``scripts/sandbox_env.sh``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polar import auth
from polar.errors import SandboxError
from polar.runtime import bwrap, open_runtime
from polar.runtime.local import LocalRuntime
from polar.settings import Isolation, Settings
from tests.runtime.conftest import tools_dir

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sandboxed() -> None:
    problem = bwrap.bwrap_problem()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{problem} (make tools installs it: scripts/sandbox_env.sh)")
        pytest.skip(problem)


def _settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **overrides: object) -> Settings:
    monkeypatch.delenv("POLAR_RUNTIME_ISOLATION", raising=False)
    tools = tmp_path / "tools"
    (tools / "bin").mkdir(parents=True, exist_ok=True)
    (tools / "bin" / "hello-tool").write_text("#!/bin/sh\necho tool says hello\n")
    (tools / "bin" / "hello-tool").chmod(0o755)
    # No POLAR_CONTROL_TOKEN: the token is generated into its file in POLAR_HOME.
    return Settings(home=tmp_path / "home", tools=tools, control_token="", **overrides)


def _host_files(tmp_path: Path, settings: Settings) -> dict[str, Path]:
    """Files a task must not read: a secret beside the runtime folder, the control token, the store."""
    settings.home.mkdir(parents=True, exist_ok=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    auth.control_token(settings)  # creates $POLAR_HOME/control-token
    store = settings.home / "polar.db"
    store.write_text("not really SQLite\n")
    return {"secret": secret, "token": auth.token_path(settings), "store": store, "repo": REPO / "pyproject.toml"}


def _reads(files: dict[str, Path]) -> str:
    return "; ".join(
        f"cat {shlex.quote(str(path))} >/dev/null 2>&1 && echo {name}=read" for name, path in files.items()
    )


async def test_the_default_local_runtime_cannot_read_host_files_outside_its_folder(sandboxed, tmp_path, monkeypatch):
    settings = _settings(tmp_path, monkeypatch)
    assert settings.runtime_isolation is Isolation.AUTO
    files = _host_files(tmp_path, settings)
    runtime = open_runtime("local", settings, "r1")
    assert runtime.describe()["isolation"] == "bwrap"
    await runtime.start(fresh=True)
    result = await runtime.exec(f"{_reads(files)}; ls -A {shlex.quote(str(settings.home))}; true")
    assert "=read" not in result.stdout, result.stdout
    # POLAR_HOME shows only the way to this runtime's own folder (runtimes/r1): no token, no store.
    assert result.stdout.split() == ["runtimes"]
    # Its own folder, the tools, the interpreter, git and sh work.
    script = (
        "echo mine > own.txt && cat own.txt && hello-tool && git init -q . && echo git=ok && "
        "sh -c 'echo sh=ok' && python3 -c 'print(\"python3=ok\")' && "
        f"{sys.executable} -c \"import harness_adapters.polar_agent; print('agent=ok')\""
    )
    result = await runtime.exec(script, env={"PATH": f"{settings.tools_dir / 'bin'}:/usr/bin:/bin"})
    assert result.ok, result.stderr
    assert result.stdout.split() == ["mine", "tool", "says", "hello", "git=ok", "sh=ok", "python3=ok", "agent=ok"]
    # Writes stay in the runtime's folder: the host's system and /tmp are not writable or private.
    result = await runtime.exec("touch /usr/polar-probe 2>/dev/null || echo usr=refused; touch /tmp/x; ls /tmp")
    assert "usr=refused" in result.stdout and not Path("/usr/polar-probe").exists()


async def test_a_node_cli_from_the_tools_folder_runs_in_the_sandbox(sandboxed, tmp_path, monkeypatch):
    tools = tools_dir()
    if not (tools / "node" / "bin" / "node").is_file():
        pytest.skip(f"no Node in the tools folder {tools} (make tools)")
    runtime = LocalRuntime("r2", tmp_path / "rt", tools_dir=tools)
    assert runtime.isolation is Isolation.BWRAP
    await runtime.start(fresh=True)
    result = await runtime.exec(
        "node -e \"const fs=require('fs'); fs.writeFileSync('n.txt', 'node'); console.log(require('os').homedir())\""
    )
    assert result.ok, result.stderr
    assert result.stdout.strip() == str(runtime.layout.home)
    assert (runtime.layout.work / "n.txt").read_text() == "node"


async def test_isolation_none_set_explicitly_runs_on_the_host_and_reads_them(tmp_path, monkeypatch):
    settings = _settings(tmp_path, monkeypatch, runtime_isolation=Isolation.NONE)
    files = _host_files(tmp_path, settings)
    runtime = open_runtime("local", settings, "r3")
    assert runtime.describe()["isolation"] == "none"
    await runtime.start(fresh=True)
    result = await runtime.exec(_reads(files))
    assert sorted(result.stdout.split()) == ["repo=read", "secret=read", "store=read", "token=read"]


def test_bwrap_refuses_and_auto_falls_back_with_a_warning_where_bubblewrap_does_not_work(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(bwrap, "bwrap_problem", lambda: "bwrap does not work here: a test says so")
    bwrap._warn_fallback.cache_clear()
    with pytest.raises(SandboxError, match="isolation 'bwrap': bwrap does not work here"):
        LocalRuntime("r4", tmp_path, isolation=Isolation.BWRAP)
    with caplog.at_level(logging.WARNING, logger="polar.runtime.bwrap"):
        runtime = LocalRuntime("r5", tmp_path)
    assert runtime.isolation is Isolation.NONE
    assert "POLAR_RUNTIME_ISOLATION=auto: bwrap does not work here" in caplog.text
    bwrap._warn_fallback.cache_clear()


WORKER = """
import asyncio, sys
from pathlib import Path
from polar.runtime.local import LocalRuntime

async def main():
    runtime = LocalRuntime("w", Path(sys.argv[1]))
    assert runtime.isolation.value == "bwrap"
    await runtime.start(fresh=True)
    await runtime.exec("(while true; do echo . >> beat; sleep 0.05; done) & sleep 600", timeout_s=600)

asyncio.run(main())
"""


async def test_a_confined_command_and_its_children_die_with_a_killed_worker(sandboxed, tmp_path):
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path)], cwd=REPO)
    beat = tmp_path / "w" / "work" / "beat"
    try:
        deadline = time.monotonic() + 60
        while not (beat.exists() and beat.stat().st_size > 10):
            assert worker.poll() is None and time.monotonic() < deadline, "the confined command never started"
            await asyncio.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    await asyncio.sleep(0.5)  # the parent-death signal and bubblewrap's --die-with-parent take the whole sandbox
    size = beat.stat().st_size
    await asyncio.sleep(0.5)
    assert beat.stat().st_size == size
