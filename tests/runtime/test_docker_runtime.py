"""The docker runtime on a real engine: exec (exit code, output, environment, working folder), limits, timeouts
and cancellation that kill the whole process group, file and folder transfer, a missing image, the lifeline and
the reaper, and a network holding only ``lo`` whose one way out is the tunnel to the service passed to ``reach``."""

from __future__ import annotations

import asyncio
import http.server
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from polar.errors import SandboxError
from polar.runtime import lifeline
from polar.runtime.docker import DockerRuntime
from polar.runtime.docker_engine import DockerOptions
from polar.runtime.reaper import reap_orphans
from tests.runtime.conftest import IMAGE, tools_dir

POLAR = str(Path(sys.executable).parent / "polar")


def runtime(root: Path, key: str = "rt", **options) -> DockerRuntime:
    return DockerRuntime(
        key, root, image=IMAGE, tools_dir=tools_dir(), options=DockerOptions(**options), env={"FROM_TASK": "t"}
    )


async def test_exec_reports_exit_code_output_env_and_cwd_and_applies_limits(no_leaks, docker_engine):
    rt = runtime(no_leaks, cpus=0.5, memory_mb=128)
    await rt.start(fresh=True)
    try:
        await rt.write_file("sub/x.txt", "")
        result = await rt.exec(
            "echo out; echo err >&2; echo $FROM_TASK $EXTRA $HOME; pwd; exit 3", env={"EXTRA": "e"}, cwd="sub"
        )
        assert (result.returncode, result.timed_out) == (3, False)
        assert result.stdout.splitlines() == ["out", f"t e {rt.layout.home}", str(rt.layout.work / "sub")]
        assert result.stderr == "err\n"
        host = docker_engine.containers.get(rt.name).attrs["HostConfig"]
        assert (host["NanoCpus"], host["Memory"], host["NetworkMode"]) == (500_000_000, 128 * 2**20, "none")
        missing = await rt.exec(["/no/such/program"])
        assert missing.returncode == 127 and "not found" in missing.stderr
        with pytest.raises(SandboxError, match="no folder"):
            await rt.exec("pwd", cwd="no/such/folder")
    finally:
        await rt.stop(remove=True)
    assert not rt.layout.root.exists()


async def test_timeout_and_cancellation_kill_the_whole_process_group(no_leaks):
    rt = runtime(no_leaks)
    await rt.start(fresh=True)
    try:
        result = await rt.exec("sleep 300 & sleep 200", timeout_s=1)
        assert result.timed_out and result.returncode is None and result.duration_s < 10
        task = asyncio.create_task(rt.exec("sleep 400"))
        await asyncio.sleep(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        left = await rt.exec("ps -eo args")
        assert not any(f"sleep {n}" in left.stdout for n in (200, 300, 400))
        # A resumed flow (another runtime object) kills a leftover by the handle recorded at spawn.
        handles = []

        async def spawned(handle) -> None:
            handles.append(handle)

        leftover = asyncio.create_task(rt.exec("sleep 450", on_spawn=spawned))
        while not handles:
            await asyncio.sleep(0.05)
        assert await runtime(no_leaks).kill(handles[0])
        assert (await leftover).returncode == 137
        # A background child of a command that exits is killed with it, too.
        await rt.exec("sleep 500 &")
        assert "sleep 500" not in (await rt.exec("ps -eo args")).stdout
    finally:
        await rt.stop(remove=True)


async def test_upload_download_and_reattach_on_the_folder(no_leaks, tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    (src / "d").mkdir()
    (src / "d" / "a.txt").write_text("A")
    rt = runtime(no_leaks)
    await rt.start(fresh=True)
    try:
        await rt.upload(src / "d", "in")
        assert (await rt.exec("cat in/a.txt && mkdir -p out && echo B > out/b.txt")).stdout == "A"
        target = tmp_path_factory.mktemp("dst")
        await rt.download("out", target / "out")
        assert (target / "out" / "b.txt").read_text() == "B\n"
        with pytest.raises(SandboxError):
            await rt.download("nothing-here", target / "x")
        # The container holds no state: a new runtime object (a later stage) reattaches, even after it died.
        again = runtime(no_leaks)
        await again.start(fresh=False)
        assert (await again.exec("cat in/a.txt")).stdout == "A"
        rt.client.containers.get(rt.name).kill()
        assert (await again.exec("cat in/a.txt")).stdout == "A"
    finally:
        await rt.stop(remove=True)


async def test_a_missing_image_is_a_clear_error_and_leaves_nothing(no_leaks):
    rt = runtime(no_leaks, image="polar/no-such-image:1")
    with pytest.raises(SandboxError, match="not on this Docker engine.*never pulls"):
        await rt.start(fresh=True)


async def test_a_container_stops_with_its_lifeline_and_is_reaped_then_remade_on_its_folder(no_leaks):
    rt = runtime(no_leaks, "maker-died")
    await rt.start(fresh=True)
    try:
        await rt.write_file("kept.txt", "on the host")
        running = await asyncio.to_thread(rt._find)
        assert running.status == "running" and running.name in lifeline.held()
        lifeline.release(rt.name)  # what the death of the process that made it does
        for _ in range(100):
            if (await asyncio.to_thread(rt._find)).status != "running":
                break
            await asyncio.sleep(0.1)
        (removed,) = reap_orphans(root=no_leaks)
        assert removed.name == rt.name and "stopped" in removed.reason
        await rt.start(fresh=False)  # a later stage: a new container on the same folder
        assert (await rt.exec("cat kept.txt")).stdout == "on the host"
    finally:
        await rt.stop(remove=True)
    assert rt.name not in lifeline.held()


async def test_the_reaper_removes_containers_whose_folder_is_gone(no_leaks):
    orphan, live = runtime(no_leaks, "orphan"), runtime(no_leaks, "live")
    await orphan.start(fresh=True)
    await live.start(fresh=True)
    try:
        shutil.rmtree(orphan.layout.root)  # its process crashed, and the folder was cleaned up
        # As docs/cli.md shows it (every orphan on the engine: earlier tests leave none).
        done = subprocess.run([POLAR, "runtime", "reap"], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0 and f"removed {orphan.name}: " in done.stdout, done.stdout + done.stderr
        assert "folder" in done.stdout and "gone" in done.stdout
        assert orphan._find() is None and live._find() is not None
        assert [r.name for r in reap_orphans(root=no_leaks, max_age_s=0)] == [live.name]
    finally:
        await live.stop(remove=True)


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello from " + self.path.encode())

    def log_message(self, *args) -> None:
        pass


def _serve() -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def test_network_none_reaches_only_the_service_given_to_reach(no_leaks):
    allowed, other = _serve(), _serve()
    rt = runtime(no_leaks)
    await rt.start(fresh=True)
    try:
        links = (await rt.exec("cat /proc/net/dev")).stdout
        assert "lo:" in links and "eth0" not in links
        url = f"http://127.0.0.1:{allowed.server_port}/base"
        async with rt.reach(url) as inner:
            assert inner == url  # the relay listens inside on the same port, on the container's loopback
            node = tools_dir() / "node" / "bin" / "node"
            fetch = (
                "fetch(process.argv[1]).then(r => r.text())"
                ".then(t => console.log(t), e => console.log('ERR', e.cause?.code))"
            )
            got = await rt.exec([str(node), "-e", fetch, f"{inner}/x"], timeout_s=30)
            assert got.stdout.strip() == "hello from /base/x", got.stderr
            blocked = await rt.exec([str(node), "-e", fetch, f"http://127.0.0.1:{other.server_port}/"], timeout_s=30)
            assert blocked.stdout.startswith("ERR ECONNREFUSED")
            dns = await rt.exec("getent hosts deb.debian.org", timeout_s=30)
            assert dns.returncode != 0
        after = await rt.exec([str(node), "-e", fetch, f"{url}/x"], timeout_s=30)
        assert after.stdout.startswith("ERR"), "the tunnel closes with the context"
    finally:
        await rt.stop(remove=True)
        allowed.shutdown()
        other.shutdown()


async def test_network_host_is_the_explicit_way_to_share_the_hosts_network(no_leaks, docker_engine):
    service = _serve()
    rt = runtime(no_leaks, network="host")
    await rt.start(fresh=True)
    try:
        assert docker_engine.containers.get(rt.name).attrs["HostConfig"]["NetworkMode"] == "host"
        url = f"http://127.0.0.1:{service.server_port}"
        async with rt.reach(url) as inner:
            assert inner == url
            probe = (
                f"exec 3<>/dev/tcp/127.0.0.1/{service.server_port} "
                "&& printf 'GET /h HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3"
            )
            assert "hello from /h" in (await rt.exec(probe, timeout_s=30)).stdout
    finally:
        await rt.stop(remove=True)
        service.shutdown()
