"""The ``docker`` runtime: each rollout in its own container, on the official ``docker`` SDK.

The runtime's folder tree (``RuntimeLayout``) lives on the host, as for ``local``, and is bind-mounted into the
container at the same path, so every path the pipeline and the harness use means the same file on both sides
and a container made again on it loses only processes and what was written outside the folder. ``start(fresh=
False)`` (a later stage, a resumed flow) reattaches to the running container or creates a new one on the folder;
``use_network`` (the verifier's network) keeps the rest too, committing the container before making it again.

- Engine access, task options and labels: ``polar.runtime.docker_engine``.
- Image: ``options.image`` or ``POLAR_DOCKER_IMAGE``; never pulled (a missing image is a ``SandboxError``).
  ``options.build`` builds one from a folder inside ``POLAR_COPY_ROOTS`` instead (``polar.runtime.images``:
  content-hashed tag, cached, logs kept); ``seed_workdir`` makes the image's WORKDIR the work folder.
  It needs ``sh``, ``setsid``, ``cat`` and ``kill``; ``git`` for artifact collection.
- A container lives at most as long as the process that made it (``polar.runtime.lifeline``): when a worker
  dies, even by kill -9, its containers stop, and every harness in them with it. A later stage or a takeover in
  another process makes a new container on the same folder.
- Agent CLIs and Node come read-only from the tools folder (``POLAR_TOOLS``), mounted at its host path, with
  ``<tools>/node/bin`` first on ``PATH``: images stay generic.
- Limits: ``cpus``, ``memory_mb`` (no swap beyond it), ``pids_limit``.
- Network ``none`` (default): only ``lo``. ``reach(url)`` opens a Unix-socket tunnel to that one service (the
  gateway) and a relay inside listening on the same port on loopback; nothing else is reachable. Network
  ``host`` shares the host's network (``reach`` is then the identity).
- ``exec`` runs the command in a new session inside the container with its output in files of the folder;
  on timeout, cancellation or exit its whole process group is killed. A container that dies while a command
  runs ends that command with exit code 137 (or the container's) and a note in its stderr.
- ``stop`` removes the container (``remove`` also the folder). Every container carries ``polar.*`` labels;
  ``polar.runtime.reaper`` removes orphans: stopped, their folder gone, or too old.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import shlex
import shutil
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from polar.errors import SandboxError
from polar.runtime import lifeline
from polar.runtime.base import ExecResult, ProcessHandle, SpawnHook
from polar.runtime.docker_engine import LABEL, DockerOptions, api_error, docker_client, seed_workdir
from polar.runtime.docker_exec import ExecFiles
from polar.runtime.images import check_inside, ensure_image
from polar.runtime.local import LocalRuntime, _tail
from polar.runtime.tunnel import SANDBOX_SOCKET_DIR, gateway_tunnel

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Blocking SDK calls (an exec's attach lasts as long as the command) get threads of their own, so a batch of
# running harnesses never starves the default executor the pipeline's database calls share.
_EXECUTOR = ThreadPoolExecutor(max_workers=64, thread_name_prefix="polar-docker")


class DockerRuntime(LocalRuntime):
    """Files as ``LocalRuntime`` (a host folder, bind-mounted); commands in the container."""

    kind = "docker"

    def __init__(
        self,
        key: str,
        base: Path,
        *,
        image: str,
        tools_dir: Path,
        options: DockerOptions | None = None,
        env: Mapping[str, str] | None = None,
        docker_host: str = "",
        network: str = "none",
        build_network: str = "none",
        build_roots: Sequence[Path] = (),
        build_logs: Path | None = None,
    ):
        super().__init__(key, base, env=env)
        self.build_roots = tuple(build_roots)
        self.build_network = build_network
        self.build_logs = build_logs or Path(base) / "image-builds"
        self.options = options or DockerOptions()
        self.image = self.options.image or image
        self.network = self.options.network or network
        self.tools_dir = Path(tools_dir).expanduser().resolve()
        self.name = f"polar-{key}"
        self._docker_host = docker_host
        self._container: Any = None

    @property
    def client(self) -> Any:
        return docker_client(self._docker_host)

    async def _call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, functools.partial(function, *args, **kwargs))

    # ---- lifecycle ----------------------------------------------------------------------------------

    def _mounts(self) -> dict[str, dict[str, str]]:
        root = str(self.layout.root)
        volumes = {
            root: {"bind": root, "mode": "rw"},
            str(self._socket_dir()): {"bind": SANDBOX_SOCKET_DIR, "mode": "rw"},
        }
        if self.options.mount_tools and self.tools_dir.is_dir():
            volumes[str(self.tools_dir)] = {"bind": str(self.tools_dir), "mode": "ro"}
        return volumes

    def _socket_dir(self) -> Path:
        # Not under the runtime root: a Unix socket path must stay short (108 bytes), whatever the root is.
        return Path("/tmp/polar-tunnels") / hashlib.sha256(str(self.layout.root).encode()).hexdigest()[:16]

    def _create(self) -> Any:
        import docker

        self._socket_dir().mkdir(parents=True, exist_ok=True)
        limits: dict[str, Any] = {}
        if self.options.cpus:
            limits["nano_cpus"] = int(self.options.cpus * 1e9)
        if self.options.memory_mb:
            limits["mem_limit"] = limits["memswap_limit"] = f"{self.options.memory_mb}m"
        if self.options.pids_limit:
            limits["pids_limit"] = self.options.pids_limit
        labels = {
            LABEL: "docker",
            "polar.key": self.key,
            "polar.root": str(self.layout.root),
            "polar.created": str(int(time.time())),
        }
        try:
            container = self.client.containers.create(
                self.image,
                lifeline.LIFELINE_COMMAND,
                name=self.name,
                labels=labels,
                init=True,
                network_mode=self.network,
                volumes=self._mounts(),
                working_dir=str(self.layout.work),
                hostname="polar-sandbox",
                **lifeline.lifeline_options(),
                **limits,
            )
            lifeline.hold(container)  # before it starts: there is no moment it could outlive this process
            container.start()
            if self.options.seed_workdir:
                self._seed_workdir(container)
        except docker.errors.ImageNotFound:
            raise SandboxError(
                f"image {self.image!r} is not on this Docker engine (Polar never pulls images: build or load it, "
                "for example with scripts/docker_env.sh start)"
            ) from None
        except docker.errors.APIError as exc:
            with contextlib.suppress(Exception):
                self.client.containers.get(self.name).remove(force=True)
            lifeline.release(self.name)
            raise SandboxError(f"cannot start container {self.name} from {self.image!r}: {api_error(exc)}") from None
        return container

    def _seed_workdir(self, container: Any) -> None:
        workdir = (self.client.images.get(self.image).attrs.get("Config") or {}).get("WorkingDir") or ""
        seed_workdir(container, workdir, str(self.layout.work), self.layout.private / "workdir-seeded")

    def _build_image(self) -> None:
        spec = self.options.build
        if spec is None:
            return
        check_inside(spec, self.build_roots)
        self.image = ensure_image(self.client, spec, self.build_logs, network=spec.network or self.build_network)

    def _find(self) -> Any:
        import docker

        try:
            return self.client.containers.get(self.name)
        except docker.errors.NotFound:
            return None

    def _remove(self) -> None:
        container = self._find()
        if container is not None:
            committed = (container.attrs.get("Config") or {}).get("Image") == self._state_image
            with contextlib.suppress(Exception):
                container.remove(force=True)
            if committed:
                with contextlib.suppress(Exception):
                    self.client.images.remove(self._state_image, force=True)
        lifeline.release(self.name)
        self._container = None

    def _ensure(self) -> Any:
        """The running container, created on the folder if it is missing or has stopped."""
        import docker

        container = self._container or self._find()
        if container is not None:
            try:
                container.reload()
            except docker.errors.NotFound:  # removed under us (the reaper, another process): make a new one
                container = None
        if container is not None and container.status != "running":
            # Stopped: its maker died (its lifeline closed) or the engine killed it. Only processes are lost.
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
            container = None
        self._container = container or self._create()
        return self._container

    async def start(self, *, fresh: bool) -> None:
        try:
            if fresh:
                await self._call(self._remove)
            await super().start(fresh=fresh)
            await self._call(self._build_image)
            await self._call(self._ensure)
        except SandboxError:
            raise
        except Exception as exc:  # noqa: BLE001 - an engine that went away, a refused call: the stage fails clearly
            raise SandboxError(f"the Docker engine failed starting container {self.name}: {api_error(exc)}") from None

    @property
    def _state_image(self) -> str:  # what ``use_network`` commits the container to; nothing else starts from it
        return f"polar-state/{self.key.lower()}:network"

    async def use_network(self, network: str) -> None:
        """A container's network is fixed when it is made, so the running one is committed to an image (everything
        the agent left outside the work folder too) and made again from it on ``network``; the work folder is the
        same host folder. The image (``polar-state/<key>:network``) is removed with the container made from it."""
        if network != self.network:
            await self._call(self._renetwork, network)

    def _renetwork(self, network: str) -> None:
        container = self._ensure()
        repository, tag = self._state_image.split(":")
        try:
            container.commit(repository=repository, tag=tag)
        except Exception as exc:  # noqa: BLE001 - the engine's refusal, named
            raise SandboxError(f"cannot keep container {self.name}'s state to change its network: {exc}") from None
        self._remove()
        self.image, self.network = self._state_image, network
        self._ensure()

    async def stop(self, *, remove: bool) -> None:
        await self._call(self._remove)
        await super().stop(remove=remove)
        if remove:
            shutil.rmtree(self._socket_dir(), ignore_errors=True)

    def interpreter(self, host_python: str) -> str:
        return self.options.python  # the host's interpreter is not in the container

    def describe(self) -> dict[str, Any]:
        return {
            "type": self.kind,
            "key": self.key,
            "root": str(self.layout.root),
            "container": self.name,
            "image": self.image,
            "network": self.network,
        }

    # ---- commands -----------------------------------------------------------------------------------

    def command_env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        path = f"{self.tools_dir / 'node' / 'bin'}:{BASE_PATH}" if self.options.mount_tools else BASE_PATH
        env = {
            "PATH": path,
            "HOME": str(self.layout.home),
            "TMPDIR": str(self.layout.tmp),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        env.update(self.env)
        env.update(extra or {})
        return env

    async def _kill_group(self, pgid: int) -> None:
        container = self._container or await self._call(self._find)
        if container is None:
            return
        with contextlib.suppress(Exception):
            await self._call(container.exec_run, ["kill", "-KILL", "--", f"-{pgid}"])

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
        stdout_path: Path | None = None,
        stderr_path: Path | None = None,
        on_spawn: SpawnHook | None = None,
    ) -> ExecResult:
        container = await self._call(self._ensure)
        workdir = self.resolve(cwd) if cwd else self.layout.work
        if not workdir.is_dir():
            raise SandboxError(f"cannot start {command!r} in container {self.name}: no folder {workdir}")
        self._exec_count += 1
        out, err = (self.resolve(str(path)) if path else None for path in (stdout_path, stderr_path))
        files = ExecFiles.make(self.layout.private, self._exec_count, out, err)
        argv = ["bash", "-c", command] if isinstance(command, str) else [str(part) for part in command]
        api = self.client.api
        try:
            created = await self._call(
                api.exec_create,
                container.id,
                files.wrapped(argv),
                environment=self.command_env(env),
                workdir=str(workdir),
            )
            exec_id = created["Id"]
        except Exception as exc:  # noqa: BLE001 - the SDK raises several kinds; all mean the command did not start
            raise SandboxError(f"cannot start {command!r} in container {self.name}: {api_error(exc)}") from None
        started = time.monotonic()
        finished = asyncio.ensure_future(self._call(api.exec_start, exec_id, detach=False, stream=False))
        timed_out = await self._wait(files, finished, timeout_s, on_spawn)
        returncode, note = await self._outcome(container, exec_id, files)
        files.remove()
        return ExecResult(
            None if timed_out else returncode, _tail(files.stdout), _tail(files.stderr) + note, timed_out,
            time.monotonic() - started,
        )  # fmt: skip

    async def _wait(
        self, files: ExecFiles, finished: asyncio.Future[Any], timeout_s: float | None, on_spawn: SpawnHook | None
    ) -> bool:
        """Wait for the command (whether it timed out); its process group is killed however the wait ends."""
        pgid: int | None = None
        try:
            if on_spawn is not None and (pgid := await files.group(finished)) is not None:
                await on_spawn(ProcessHandle(pgid, 0))
            try:
                await asyncio.wait_for(asyncio.shield(finished), timeout_s)
            except TimeoutError:
                return True
            return False
        finally:
            if not finished.done():
                pgid = pgid or await files.group(finished)
                if pgid is not None:
                    await self._kill_group(pgid)
                with contextlib.suppress(Exception):
                    await asyncio.shield(finished)

    async def _outcome(self, container: Any, exec_id: str, files: ExecFiles) -> tuple[int | None, str]:
        if (code := files.returncode()) is not None:
            return code, ""
        # No exit code written: the command was killed, or the container went away under it.
        await self._call(container.reload)
        if container.status != "running":
            state = container.attrs.get("State", {})
            code = state.get("ExitCode") or 137
            return code, (
                f"\n[polar] container {self.name} stopped while the command ran "
                f"(status {container.status}, exit code {state.get('ExitCode')}, OOMKilled {state.get('OOMKilled')})"
            )
        info = await self._call(self.client.api.exec_inspect, exec_id)
        code = info.get("ExitCode")
        # setsid -w reports a child killed by a signal as the signal's number: shown as 128 + signal, the shell's way.
        return (128 + code if isinstance(code, int) and 0 < code < 128 else code), ""

    async def kill(self, process: ProcessHandle) -> bool:
        container = await self._call(self._find)
        if container is None or container.status != "running":
            return False
        await self._kill_group(process.pid)
        return True

    # ---- the way out ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reach(self, url: str) -> AsyncIterator[str]:
        if self.network == "host":
            yield url
            return
        container = await self._call(self._ensure)

        async def start(argv: list[str], log: Path) -> None:
            launch = f"exec {shlex.join(argv)} >{shlex.quote(str(log))} 2>&1"
            await self._call(container.exec_run, ["sh", "-c", launch], detach=True)

        async def stop(pid: int) -> None:
            await self._call(container.exec_run, ["kill", "-KILL", str(pid)])

        tunnel = gateway_tunnel(
            url,
            socket_dir=self._socket_dir(),
            private=self.layout.private,
            tools_dir=self.tools_dir,
            start=start,
            stop=stop,
            where=f"container {self.name}",
        )
        async with tunnel as inner:
            yield inner
