"""A Postgres server owned by one test: initdb in a temporary folder, started on a free port, stopped by PID.

Tests freeze it (SIGSTOP on the postmaster and every backend process) to show what the gateway does when its
store stops answering, which the shared server at 127.0.0.1:5432 must never be put through.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.proxy.gateway_server import free_port


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _user() -> str | None:
    """Postgres refuses to run as root: as root, run it as the ``postgres`` user."""
    if os.geteuid() != 0:
        return None
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        return ""
    return "postgres"


INITDB, POSTGRES = _bin("initdb"), _bin("postgres")
needs_own_postgres = pytest.mark.skipif(
    not (INITDB and POSTGRES) or _user() == "", reason="initdb/postgres not installed (or root without a postgres user)"
)


class OwnPostgres:
    """``with OwnPostgres(tmp) as pg: pg.url``; ``pg.freeze()`` / ``pg.thaw()`` stop and continue every process."""

    def __init__(self) -> None:
        # Not under pytest's tmp_path: that is private to root, and the server runs as the postgres user.
        self.folder = Path(tempfile.mkdtemp(prefix="polar-own-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self.process: subprocess.Popen[bytes] | None = None
        self._user = _user()

    def __enter__(self) -> OwnPostgres:
        if self._user:
            shutil.chown(self.folder, self._user)
        assert INITDB and POSTGRES
        subprocess.run(
            [INITDB, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            user=self._user,
        )
        log = open(self.folder / "postgres.log", "wb")
        self.process = subprocess.Popen(
            [POSTGRES, "-D", str(self.data), "-p", str(self.port), "-c", "listen_addresses=127.0.0.1"]
            + ["-k", str(self.folder), "-c", "fsync=off"],
            stdout=log,
            stderr=subprocess.STDOUT,
            user=self._user,
        )
        log.close()
        deadline = time.monotonic() + 60
        import psycopg

        while time.monotonic() < deadline:
            try:
                psycopg.connect(
                    f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", connect_timeout=2
                ).close()
                return self
            except psycopg.OperationalError:
                if self.process.poll() is not None:
                    raise RuntimeError((self.folder / "postgres.log").read_text()) from None
                time.sleep(0.2)
        raise TimeoutError("the test's postgres did not start")

    def pids(self) -> list[int]:
        """The postmaster and its children (backends, checkpointer, ...)."""
        assert self.process is not None
        root = self.process.pid
        found = [root]
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == root:
                found.append(int(Path(stat).parent.name))
        return found

    def _signal(self, sig: signal.Signals) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def freeze(self) -> None:
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def __exit__(self, *exc: object) -> None:
        try:
            self._stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _stop(self) -> None:
        if self.process is None:
            return
        self.thaw()
        self.process.send_signal(signal.SIGINT)  # fast shutdown
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
