"""The local runtime: its own folders and HOME, a clean environment, timeouts that kill the whole process
group, paths confined to the runtime, and (where bubblewrap is installed) a read-only host."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from polar.errors import SandboxError
from polar.runtime import LocalRuntime, bwrap_available, open_runtime
from polar.runtime.base import ProcessHandle
from polar.settings import Isolation, Settings


async def test_commands_run_in_the_workdir_with_their_own_home_and_a_clean_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("POLAR_DATABASE_URL", "postgresql://secret@db/prod")
    runtime = LocalRuntime("r1", tmp_path, env={"TASK_VAR": "x"})
    await runtime.start(fresh=True)
    result = await runtime.exec(
        'echo "$PWD|$HOME|$TASK_VAR|${POLAR_DATABASE_URL:-unset}"; python -c "import sys; print(sys.prefix)"'
    )
    cwd, home, task_var, leaked = result.stdout.splitlines()[0].split("|")
    assert (cwd, home, task_var, leaked) == (str(runtime.layout.work), str(runtime.layout.home), "x", "unset")
    assert result.ok and not result.timed_out
    # `python` in a command is this interpreter (the venv with the package's dependencies).
    assert result.stdout.splitlines()[1] == sys.prefix


@pytest.mark.parametrize("isolation", [Isolation.NONE, Isolation.AUTO])
async def test_a_timeout_kills_the_command_and_everything_it_started(tmp_path, isolation):
    runtime = LocalRuntime("r2", tmp_path, isolation=isolation)
    await runtime.start(fresh=True)
    started = time.monotonic()
    # The backgrounded child beats into a file: seen from the host, whatever PID namespace it had.
    beat = "(while true; do echo . >> beat; sleep 0.05; done) & sleep 60"
    result = await runtime.exec(beat, timeout_s=0.5)
    assert result.timed_out and result.returncode is None and time.monotonic() - started < 5
    size = (runtime.layout.work / "beat").stat().st_size
    await asyncio.sleep(0.3)
    assert (runtime.layout.work / "beat").stat().st_size == size


async def test_paths_stay_inside_the_runtime_and_a_fresh_start_wipes_it(tmp_path):
    runtime = LocalRuntime("r3", tmp_path)
    await runtime.start(fresh=True)
    await runtime.write_file("sub/a.txt", "hello")
    assert (await runtime.read_file("sub/a.txt")) == b"hello"
    with pytest.raises(SandboxError, match="outside runtime"):
        await runtime.write_file("../../escape.txt", "x")
    with pytest.raises(SandboxError, match="outside runtime"):
        await runtime.read_file("/etc/hostname")
    await runtime.start(fresh=True)
    assert not (runtime.layout.work / "sub").exists()
    other = LocalRuntime("missing", tmp_path)
    with pytest.raises(SandboxError, match="no folder"):
        await other.start(fresh=False)


async def test_kill_only_kills_the_process_it_recorded(tmp_path):
    runtime = LocalRuntime("r4", tmp_path)
    await runtime.start(fresh=True)
    handles = []

    async def remember(handle):
        handles.append(handle)

    task = asyncio.create_task(runtime.exec("sleep 30", on_spawn=remember, timeout_s=60))
    while not handles:
        await asyncio.sleep(0.01)
    assert not await runtime.kill(ProcessHandle(handles[0].pid, handles[0].start_ticks + 1))  # a reused pid
    assert await runtime.kill(handles[0])
    result = await task
    assert result.returncode == -9


def test_the_registry_builds_runtimes_from_settings(tmp_path):
    settings = Settings(home=tmp_path, runtime_root=tmp_path / "rt")
    runtime = open_runtime("local", settings, "abc", env={"A": "1"})
    assert runtime.layout.root == (tmp_path / "rt" / "abc").resolve()


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (bwrap) is not installed")
async def test_bubblewrap_makes_the_host_read_only_and_the_runtime_writable(tmp_path):
    runtime = LocalRuntime("r5", tmp_path, isolation=Isolation.BWRAP)
    await runtime.start(fresh=True)
    target = f"/usr/polar-bwrap-probe-{os.getpid()}"
    result = await runtime.exec(f"touch {target}; echo host=$?; touch inside.txt; echo work=$?; echo pid=$$")
    assert "host=1" in result.stdout and "work=0" in result.stdout
    assert not os.path.exists(target)
    assert (runtime.layout.work / "inside.txt").exists()
    assert "pid=2" in result.stdout or "pid=1" in result.stdout  # its own PID namespace
