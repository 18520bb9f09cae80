"""Hosts for the multi-host test: network namespaces this test makes, one per host, each with one veth to a hub
namespace holding a bridge (a switch). Addresses exist only on these namespaces; nothing is added to the
machine's own network. Every process is started here, in its host, and stopped by its PID; ``kill_host`` is a
machine losing power (kill -9 of every process in the namespace); ``close`` deletes the namespaces even after a
failure."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

SUBNET = "10.213.77"


def missing_tools() -> str | None:
    """Why this machine cannot run the cluster test, or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    for tool in ("ip", "haproxy", "curl", "runuser"):
        if shutil.which(tool) is None:
            return f"needs {tool} on PATH"
    if postgres_bin() is None:
        return "needs the PostgreSQL server binaries (/usr/lib/postgresql/*/bin)"
    return None


def postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    return found[-1].parent if found else None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Host:
    name: str
    netns: str
    address: str
    processes: list[subprocess.Popen] = field(default_factory=list)


class Network:
    """``Network(["db", "w1"])``: one namespace per host on a private /24, plus the hub."""

    def __init__(self, names: Sequence[str], logs: Path):
        self.tag = uuid.uuid4().hex[:6]
        self.logs = logs
        self.hub = f"pc{self.tag}-hub"
        self.hosts: dict[str, Host] = {}
        self._files: list[IO[bytes]] = []
        try:
            _ip("netns", "add", self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            for index, name in enumerate(names, start=2):
                self._add(name, index)
        except BaseException:
            self.close()
            raise

    def _add(self, name: str, index: int) -> None:
        host = Host(name, f"pc{self.tag}-{name}", f"{SUBNET}.{index}")
        _ip("netns", "add", host.netns)
        self.hosts[name] = host
        port = f"v{self.tag}{index}"  # at most 15 characters
        _ip("-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _ip("-n", self.hub, "link", "set", port, "master", "br0", "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")

    def address(self, name: str) -> str:
        return self.hosts[name].address

    def start(
        self,
        host: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str],
        log: str,
        cwd: Path | None = None,
        user: str | None = None,
    ) -> subprocess.Popen:
        """Start ``command`` in ``host``; its output goes to ``logs/<log>``. ``ip netns exec`` execs the command,
        so the PID is the command's."""
        prefix = ["ip", "netns", "exec", self.hosts[host].netns]
        if user is not None:
            prefix += ["runuser", "-u", user, "--"]
        out = (self.logs / log).open("ab")
        self._files.append(out)
        process = subprocess.Popen(
            [*prefix, *command],
            env=dict(env),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.hosts[host].processes.append(process)
        return process

    def run(self, host: str, command: Sequence[str], *, env: Mapping[str, str] | None = None, timeout_s: float = 120):
        """Run ``command`` in ``host`` to its end; returns (exit code, output)."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.hosts[host].netns, *command],
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        return done.returncode, done.stdout + done.stderr

    def http_ok(self, host: str, url: str) -> bool:
        """GET ``url`` from inside ``host``: a 2xx answer."""
        code, _ = self.run(host, ["curl", "-sf", "-o", "/dev/null", "--max-time", "3", url], timeout_s=10)
        return code == 0

    def pids(self, host: str) -> list[int]:
        """Every process in the host's namespace (``ip netns pids``)."""
        done = subprocess.run(
            ["ip", "netns", "pids", self.hosts[host].netns], capture_output=True, text=True, check=False, timeout=30
        )
        return [int(p) for p in done.stdout.split()]

    def kill_host(self, host: str) -> list[int]:
        """kill -9 of every process in ``host`` (repeated until none is left: a dying parent may fork no more)."""
        killed: list[int] = []
        for _ in range(20):
            pids = self.pids(host)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        for process in self.hosts[host].processes:
            _reap(process)
        return killed

    def stop(self, process: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 10) -> None:
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
        _reap(process)

    def close(self, stop_order: Sequence[str] = ()) -> None:
        """Stop every process (hosts in ``stop_order`` first), kill what is left in each namespace, delete them."""
        names = [*stop_order, *(n for n in self.hosts if n not in stop_order)]
        for name in names:
            for process in reversed(self.hosts[name].processes):
                self.stop(process, timeout_s=5)
            self.kill_host(name)
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, check=False, timeout=30)
        subprocess.run(["ip", "netns", "del", self.hub], capture_output=True, check=False, timeout=30)
        for out in self._files:
            out.close()


def _reap(process: subprocess.Popen) -> None:
    if process.poll() is None:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for(condition: Callable[[], object], timeout_s: float, what: str, *, every_s: float = 0.5) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


CLONE_NEWNET = 0x40000000


def in_namespace(netns: str, fn: Callable[[], object]) -> object:
    """``fn()`` in a thread that joined ``netns`` (setns applies to the calling thread only): sockets it opens are
    that host's, so the test reads a host's HTTP API without any address outside the test's namespaces."""
    import ctypes
    import threading

    outcome: dict[str, object] = {}

    def target() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {netns} failed")
        finally:
            os.close(fd)
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"in-{netns}")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome.get("value")
