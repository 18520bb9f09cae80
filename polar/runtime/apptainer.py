"""The ``apptainer`` runtime: each rollout in its own Apptainer instance, on the ``apptainer`` command line.

As with ``docker``, the runtime's folder tree stays on the host and is bound into the instance at the same path
(with the tools folder read-only and the tunnel's socket folder), so the pipeline's paths hold on both sides.
The instance is started with ``--containall`` (no host home, /tmp or cwd), ``--no-mount hostfs`` and, by
default, ``--net --network none`` (only ``lo``; ``reach`` then runs the same Unix-socket tunnel and loopback
relay as the docker runtime). Commands are ``apptainer exec instance://NAME ...`` subprocesses of this machine,
run and killed like the local runtime's (their host process group). Apptainer has no CPU or memory limits here.

Apptainer is not packaged for this machine's Debian, so this runtime is untested here: its tests skip where
``apptainer`` is absent (docs/runtimes.md: how to run them where it exists).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from polar.errors import SandboxError
from polar.runtime.local import LocalRuntime
from polar.runtime.tunnel import SANDBOX_SOCKET_DIR, gateway_tunnel


class ApptainerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: str | None = Field(default=None, description="a SIF file or sandbox folder; default POLAR_APPTAINER_IMAGE")
    network: Literal["none", "host"] = "none"
    binary: str = "apptainer"
    python: str = Field(default="python3", description="the image's interpreter: {python} in evaluator commands")


def apptainer_available(binary: str = "apptainer") -> str | None:
    """None when the command is installed, else why not (tests skip with it)."""
    if shutil.which(binary) is None:
        return f"{binary} is not installed (Debian 12 does not package it; see docs/runtimes.md)"
    return None


class ApptainerRuntime(LocalRuntime):
    kind = "apptainer"

    def __init__(
        self,
        key: str,
        base: Path,
        *,
        image: str,
        tools_dir: Path,
        options: ApptainerOptions | None = None,
        env: Mapping[str, str] | None = None,
    ):
        super().__init__(key, base, env=env)
        self.options = options or ApptainerOptions()
        self.image = self.options.image or image
        self.tools_dir = Path(tools_dir).expanduser().resolve()
        digest = hashlib.sha256(str(self.layout.root).encode()).hexdigest()[:16]
        self.instance = f"polar-{digest}"
        self.socket_dir = Path("/tmp/polar-tunnels") / digest

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.options.binary, *args], capture_output=True, text=True, timeout=120, check=False)

    def _running(self) -> bool:
        listed = self._run("instance", "list", self.instance)
        return listed.returncode == 0 and self.instance in listed.stdout

    def _start_instance(self) -> None:
        if not self.image:
            raise SandboxError("the apptainer runtime needs an image: POLAR_APPTAINER_IMAGE or runtime.options.image")
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        root = str(self.layout.root)
        binds = [f"{root}:{root}", f"{self.socket_dir}:{SANDBOX_SOCKET_DIR}"]
        if self.tools_dir.is_dir():
            binds.append(f"{self.tools_dir}:{self.tools_dir}:ro")
        net = ["--net", "--network", "none"] if self.options.network == "none" else []
        args = ["instance", "start", "--containall", "--no-mount", "hostfs", *net]
        for bind in binds:
            args += ["--bind", bind]
        started = self._run(*args, self.image, self.instance)
        if started.returncode != 0:
            raise SandboxError(
                f"cannot start apptainer instance {self.instance} from {self.image!r}: {started.stderr[-300:].strip()}"
            )

    def _stop_instance(self) -> None:
        self._run("instance", "stop", "--force", self.instance)

    async def start(self, *, fresh: bool) -> None:
        if fresh:
            await asyncio.to_thread(self._stop_instance)
        await super().start(fresh=fresh)
        if fresh or not await asyncio.to_thread(self._running):
            await asyncio.to_thread(self._start_instance)

    async def stop(self, *, remove: bool) -> None:
        await asyncio.to_thread(self._stop_instance)
        await super().stop(remove=remove)

    def describe(self) -> dict[str, Any]:
        return {
            "type": self.kind,
            "key": self.key,
            "root": str(self.layout.root),
            "instance": self.instance,
            "image": self.image,
        }

    def interpreter(self, host_python: str) -> str:
        return self.options.python

    def command_env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = super().command_env(extra)
        env["PATH"] = f"{self.tools_dir / 'node' / 'bin'}:/usr/local/bin:/usr/bin:/bin"
        return env

    def _argv(self, command: str | Sequence[str], cwd: Path) -> list[str]:
        argv = ["bash", "-c", command] if isinstance(command, str) else [str(part) for part in command]
        return [self.options.binary, "exec", "--pwd", str(cwd), f"instance://{self.instance}", *argv]

    async def use_network(self, network: str) -> None:
        if network != self.options.network:
            raise SandboxError(f"an apptainer instance keeps the network it started with ({self.options.network})")

    @contextlib.asynccontextmanager
    async def reach(self, url: str) -> AsyncIterator[str]:
        if self.options.network == "host":
            yield url
            return
        relays: list[asyncio.subprocess.Process] = []

        async def start(argv: list[str], log: Path) -> None:
            with log.open("wb") as out:
                relays.append(
                    await asyncio.create_subprocess_exec(
                        *self._argv(argv, self.layout.work),
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=out,
                        stderr=out,
                        start_new_session=True,
                    )
                )

        async def stop(pid: int) -> None:
            for process in relays:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()

        tunnel = gateway_tunnel(
            url,
            socket_dir=self.socket_dir,
            private=self.layout.private,
            tools_dir=self.tools_dir,
            start=start,
            stop=stop,
            where=f"apptainer instance {self.instance}",
        )
        async with tunnel as inner:
            yield inner
