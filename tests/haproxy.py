"""HAProxy (Debian's package) on a loopback port in front of one server, with an idle timeout on both sides: the
load balancer that cuts a connection silent for ``idle_s``, as cloud load balancers and tunnels do."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

CONFIG = """\
global
    maxconn 2048

defaults
    mode http
    timeout connect 5s
    timeout client {idle_ms}ms
    timeout server {idle_ms}ms
    timeout http-request 10s

frontend lb
    bind 127.0.0.1:{port}
    default_backend gateway

backend gateway
    server gateway {server}
"""


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy",) if Path(p).exists()), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HAProxy:
    """``with HAProxy("127.0.0.1:8700", idle_s=60, workdir=d) as lb: lb.url`` — started in the foreground
    (``-db``) and stopped by its PID on exit; its log is ``workdir/haproxy.log``."""

    def __init__(self, server: str, idle_s: float, workdir: Path):
        binary = haproxy_binary()
        if binary is None:
            raise RuntimeError("haproxy is not installed (apt-get install haproxy; `make tools` does it)")
        self.binary, self.workdir, self.port = binary, workdir, _free_port()
        self.config = workdir / "haproxy.cfg"
        self.config.write_text(CONFIG.format(idle_ms=round(idle_s * 1000), port=self.port, server=server))
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> HAProxy:
        checked = subprocess.run([self.binary, "-c", "-f", str(self.config)], capture_output=True, text=True)
        if checked.returncode != 0:
            raise RuntimeError(f"haproxy refused {self.config}: {checked.stdout}{checked.stderr}")
        with open(self.workdir / "haproxy.log", "wb") as log:
            self.proc = subprocess.Popen([self.binary, "-db", "-f", str(self.config)], stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited {self.proc.returncode}; see {self.workdir / 'haproxy.log'}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.__exit__()
        raise TimeoutError("haproxy did not listen")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
