"""Network isolation for a harness run: a fresh network namespace holding only ``lo``.

``isolation()`` finds how this machine lets us make one: ``unshare -n -m`` (root: network and mount
namespaces), else ``unshare -n``, else the same inside a user namespace (``-r``, rootless). With a mount
namespace, ``/etc/resolv.conf`` is bind-mounted to name 127.0.0.1 as the only resolver, where the runner's
DNS logger records every name a CLI tries to resolve (phone-home attempts) and answers NXDOMAIN.

``command(...)`` is the argv that runs ``tests.e2e.runner`` inside it.
"""

from __future__ import annotations

import functools
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.harness_spec import REPO


@dataclass(frozen=True)
class Isolation:
    unshare: tuple[str, ...]
    mount_ns: bool  # resolv.conf can be redirected: DNS lookups are logged

    def command(self, runner_args: list[str], run_dir: Path) -> list[str]:
        run_dir.mkdir(parents=True, exist_ok=True)
        steps = ["ip link set lo up"]
        if self.mount_ns:
            resolv = run_dir / "resolv.conf"
            steps.append(
                f"printf 'nameserver 127.0.0.1\\noptions timeout:1 attempts:1\\n' > {shlex.quote(str(resolv))}"
            )
            steps.append(f"mount --bind {shlex.quote(str(resolv))} /etc/resolv.conf")
            runner_args = [*runner_args, "--dns-log"]
        python = shlex.join([sys.executable, "-m", "tests.e2e.runner", *runner_args])
        steps.append(f"cd {shlex.quote(str(REPO))} && exec {python}")
        return [*self.unshare, "--", "bash", "-c", " && ".join(steps)]


def _works(prefix: list[str], probe: str) -> bool:
    try:
        done = subprocess.run([*prefix, "--", "bash", "-c", probe], check=False, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@functools.cache
def isolation() -> Isolation | None:
    """How to isolate a run here, or None when no network namespace can be made (the tests skip)."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        return None
    probe_mount = "ip link set lo up && mount --bind /etc/hostname /etc/hostname"  # any bind mount proves it
    for prefix in (["unshare", "-n", "-m"], ["unshare", "-r", "-n", "-m"]):
        if _works(prefix, probe_mount):
            return Isolation(tuple(prefix), True)
    for prefix in (["unshare", "-n"], ["unshare", "-r", "-n"]):
        if _works(prefix, "ip link set lo up"):
            return Isolation(tuple(prefix), False)
    return None
