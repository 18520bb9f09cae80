"""Harbor task folders as TaskRequests.

A Harbor task is a folder: ``task.toml`` (``[metadata]``, ``[agent]``, ``[verifier]``, ``[environment]``),
``instruction.md`` (what the agent is told), ``environment/`` (a Dockerfile and its build context: the agent's
starting state), ``tests/`` (``test.sh`` and its helpers: the verifier, uploaded only after the agent ran) and
optionally ``solution/solve.sh`` (the oracle). ``load_harbor`` reads one folder, or every task folder directly
under a folder, into ``HarborTask`` records; any problem is an ``InvalidRequest`` naming the task and the field,
raised before anything is returned (nothing is half-imported).

Mapping onto a ``TaskRequest`` (``HarborTask.request``):

- the docker runtime, its image built from ``environment/`` (``runtime.options.build``, ``build_timeout_sec``)
  or ``[environment] docker_image``; the image's WORKDIR is the agent's work folder (``seed_workdir``);
- ``cpus`` and ``memory``/``memory_mb`` onto the runtime's limits; ``allow_internet = false`` onto network
  ``none`` for the agent, the image build and the verifier (``true`` leaves ``POLAR_DOCKER_NETWORK``,
  ``POLAR_DOCKER_BUILD_NETWORK`` and ``POLAR_VERIFY_NETWORK``, whose defaults are all offline);
- ``[agent] timeout_sec`` is the agent budget; the shared deadline adds the build timeout to it;
- ``[verifier]`` becomes the ``harbor`` evaluator (``timeout_sec``, ``env``, ``user``) with ``tests/`` inline;
  ``[solution] env`` is the oracle's environment (``solve.sh`` runs with it);
- the task's id (its folder name) is the request's name; ``[metadata]`` and the source path go to
  ``metadata.harbor``.

Unknown keys in the sections acted on (``agent``, ``verifier``, ``environment``, ``solution``) are errors: a limit
we would silently ignore is worse than a refused import. ``[metadata]`` and other sections are kept as they are.

Symlinks are never followed out of a task folder. A task folder (anything in it: ``instruction.md``, ``tests/``,
``solution/``, the ``environment/`` build context) holding a symlink whose target lies outside the folder, or
does not resolve (a loop), is refused with the link's path named, before any file is read; and a task folder that
is itself a symlink out of the folder of task folders it was found in is refused the same way. An import path
inside ``POLAR_COPY_ROOTS`` therefore never reads a host file outside it. Links inside the folder are kept.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from polar.errors import InvalidRequest

ORACLE_DIR = ".polar/oracle"  # under the runtime's root, beside (not inside) the work folder


class AgentSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timeout_sec: float = Field(default=600.0, gt=0)
    user: str | None = None


class VerifierSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timeout_sec: float = Field(default=600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | None = None


class SolutionSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    env: dict[str, str] = Field(default_factory=dict)  # the oracle's environment: solve.sh runs with it


class McpServer(BaseModel):
    """One ``[[environment.mcp_servers]]`` entry, as Harbor declares it (each agent decides how to consume it)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    transport: Literal["stdio", "sse", "streamable-http"] = "stdio"
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    url: str | None = None


class EnvironmentSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    build_timeout_sec: float = Field(default=600.0, gt=0)
    docker_image: str | None = None
    cpus: float | None = Field(default=None, gt=0)
    memory: str | None = None
    memory_mb: int | None = Field(default=None, ge=16)
    storage: str | None = None  # recorded, not enforced (the engine's storage driver may not support quotas)
    storage_mb: int | None = None
    gpus: int = Field(default=0, ge=0, le=0, description="GPUs are not offered to task containers")
    gpu_types: list[str] | None = None  # which GPUs would do: moot while no task gets one (``gpus`` is 0)
    allow_internet: bool = True
    # Read and checked, then refused while non-empty (``read_task``): no adapter hands MCP servers to its harness yet.
    mcp_servers: list[McpServer] = Field(default_factory=list)

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        if value is not None:
            memory_mb(value)
        return value

    def limit_mb(self) -> int | None:
        return self.memory_mb if self.memory_mb is not None else (memory_mb(self.memory) if self.memory else None)


class TaskToml(BaseModel):
    model_config = ConfigDict(extra="allow")
    version: str = "1.0"
    metadata: dict[str, Any] = Field(default_factory=dict)
    agent: AgentSection = Field(default_factory=AgentSection)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)


_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def memory_mb(text: str) -> int:
    """``"2G"``, ``"512M"``, ``"1.5GiB"`` in MiB."""
    match = _MEMORY.match(text)
    if not match:
        raise ValueError(f"not a memory size: {text!r} (e.g. 2G, 512M)")
    scale = {"": 1 / 2**20, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[match.group(2).lower()]
    return max(1, int(float(match.group(1)) * scale))


@dataclass(frozen=True)
class HarborTask:
    """One Harbor task folder, read and checked."""

    task_id: str
    path: Path
    instruction: str
    config: TaskToml
    tests: dict[str, str]
    binary_tests: dict[str, str]
    executables: tuple[str, ...]
    solution: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    def request(
        self,
        harness: dict[str, Any],
        *,
        samples: int = 1,
        policies: list[dict[str, Any]] | None = None,
        prepare: list[dict[str, Any]] | None = None,
        name_suffix: str = "",
    ) -> dict[str, Any]:
        """The TaskRequest (as a dict) running ``harness`` on this task."""
        env = self.config.environment
        options: dict[str, Any] = {"seed_workdir": True}
        if (self.environment_dir / "Dockerfile").is_file():
            options["build"] = {
                "context": str(self.environment_dir.resolve()),
                "name": _image_name(self.task_id),
                "timeout_s": env.build_timeout_sec,
            }
            if not env.allow_internet:
                options["build"]["network"] = "none"

        else:
            options["image"] = env.docker_image
        if env.cpus is not None:
            options["cpus"] = env.cpus
        if env.limit_mb() is not None:
            options["memory_mb"] = env.limit_mb()
        if not env.allow_internet:
            options["network"] = "none"
        agent_s = self.config.agent.timeout_sec
        request: dict[str, Any] = {
            "name": f"{self.task_id}{name_suffix}"[:128],
            "instruction": self.instruction,
            "harness": harness,
            "runtime": {"type": "docker", "options": options, "prepare": prepare or []},
            "evaluator": {
                "type": "harbor",
                "timeout_s": self.config.verifier.timeout_sec,
                "config": {
                    "files": self.tests,
                    "binary_files": self.binary_tests,
                    "executables": list(self.executables),
                    "user": self.config.verifier.user,
                    "env": self.config.verifier.env,
                },
            },
            "num_samples": samples,
            "agent_timeout_s": agent_s,
            "timeout_s": agent_s + env.build_timeout_sec + 120.0,
            "metadata": {
                "source": "harbor",
                "task_id": self.task_id,
                "harbor": {"path": str(self.path), "version": self.config.version, "metadata": self.config.metadata},
            },
        }
        if not env.allow_internet:  # the verifier stays offline too, whatever POLAR_VERIFY_NETWORK says
            request["evaluator"]["network"] = "none"
        if policies:
            request["policies"] = policies
        return request

    def oracle_request(self) -> dict[str, Any]:
        """The task solved by its ``solution/solve.sh`` (written beside the work folder, copied to /solution)."""
        if self.solution is None:
            raise InvalidRequest(f"harbor task {self.task_id}: no solution/solve.sh", field="solution/solve.sh")
        prepare = [
            {"type": "write_file", "path": f"../{ORACLE_DIR}/{path}", "content": text}
            for path, text in sorted(self.solution.items())
        ]
        env = " ".join(shlex.quote(f"{name}={value}") for name, value in sorted(self.config.solution.env.items()))
        solve = f"env {env} bash /solution/solve.sh" if env else "bash /solution/solve.sh"
        command = f"rm -rf /solution && cp -a {{workdir}}/../{ORACLE_DIR} /solution && {solve}"
        return self.request(
            {"name": "command", "config": {"command": command, "model_calls": "none"}},
            prepare=prepare,
            name_suffix=":oracle",
        )

    def noop_request(self) -> dict[str, Any]:
        """The task with an agent that does nothing."""
        return self.request(
            {"name": "command", "config": {"command": "true", "model_calls": "none"}}, name_suffix=":noop"
        )


def _image_name(task_id: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", task_id.lower()).strip("-._")[:64] or "task"


def _bad(task: str, field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"harbor task {task}: {field}: {message}", field=field)


def _files(task: str, folder: Path, label: str) -> tuple[dict[str, str], dict[str, str], tuple[str, ...]]:
    text: dict[str, str] = {}
    binary: dict[str, str] = {}
    executables: list[str] = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        data = path.read_bytes()
        try:
            text[relative] = data.decode()
        except UnicodeDecodeError:
            binary[relative] = base64.b64encode(data).decode()
        if path.stat().st_mode & 0o111:
            executables.append(relative)
    if not text and not binary:
        raise _bad(task, label, "the folder is empty")
    return text, binary, tuple(executables)


def _escapes(link: Path, base: Path, label: str = "the task folder") -> str | None:
    """Why the symlink ``link`` leads out of ``base`` (a resolved folder), or None when it stays inside."""
    try:
        target = link.resolve(strict=False)
    except (OSError, RuntimeError) as exc:  # a loop
        return f"it does not resolve ({exc})"
    if target != base and not target.is_relative_to(base):
        return f"it points to {os.readlink(link)}, outside {label} (links are not followed out of it)"
    return None


def check_links(task: str, folder: Path) -> None:
    """Refuse ``folder`` if a symlink in it leads outside it; folders are walked without following links."""
    base = folder.resolve()
    for where, folders, files in os.walk(folder):
        for name in sorted((*folders, *files)):
            path = Path(where, name)
            if path.is_symlink() and (reason := _escapes(path, base)):
                raise _bad(task, path.relative_to(folder).as_posix(), f"a symlink: {reason}")


def _read_config(task: str, path: Path) -> tuple[dict[str, Any], TaskToml]:
    """``task.toml`` as read and as checked."""
    toml_path = path / "task.toml"
    if not toml_path.is_file():
        raise _bad(task, "task.toml", f"missing in {path}")
    try:
        raw = tomllib.loads(toml_path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise _bad(task, "task.toml", f"does not parse: {exc}") from None
    try:
        config = TaskToml.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = "unknown key" if first["type"] == "extra_forbidden" else str(first["msg"])
        raise _bad(task, f"task.toml [{where.rsplit('.', 1)[0]}] {where.rsplit('.', 1)[-1]}", message) from None
    if config.environment.mcp_servers:
        names = ", ".join(server.name for server in config.environment.mcp_servers)
        raise _bad(
            task,
            "task.toml [environment] mcp_servers",
            f"Polar does not start MCP servers for a task yet ({names}): the agent would run without the tools the "
            "task gives it, and its score would not be the task's",
        )
    return raw, config


def _check_environment(task: str, path: Path, config: TaskToml) -> None:
    compose = [p.name for p in (path / "environment").glob("docker-compose.y*ml")]
    if compose:
        raise _bad(
            task,
            f"environment/{compose[0]}",
            "multi-container tasks are not supported: the docker runtime runs the agent's one container, so the "
            "services the file adds would be missing",
        )
    if not (path / "environment" / "Dockerfile").is_file() and not config.environment.docker_image:
        raise _bad(task, "environment/Dockerfile", "missing (and task.toml names no [environment] docker_image)")


def read_task(path: Path) -> HarborTask:
    """One task folder; ``InvalidRequest`` names the task and what is wrong (a symlink out of it, too)."""
    path = Path(path)
    task = path.name
    check_links(task, path)
    raw, config = _read_config(task, path)
    instruction_path = path / "instruction.md"
    if not instruction_path.is_file():
        raise _bad(task, "instruction.md", f"missing in {path}")
    instruction = instruction_path.read_text(errors="replace").strip()
    if not instruction:
        raise _bad(task, "instruction.md", "is empty")
    _check_environment(task, path, config)
    if not (path / "tests" / "test.sh").is_file():
        raise _bad(task, "tests/test.sh", f"missing in {path}")
    tests, binary, executables = _files(task, path / "tests", "tests")
    solution = None
    if (path / "solution").is_dir():
        if not (path / "solution" / "solve.sh").is_file():
            raise _bad(task, "solution/solve.sh", "the solution folder has no solve.sh")
        solution, solution_binary, _ = _files(task, path / "solution", "solution")
        if solution_binary:
            raise _bad(task, f"solution/{sorted(solution_binary)[0]}", "oracle files must be text")
    extra = {key: value for key, value in raw.items() if key not in TaskToml.model_fields}
    return HarborTask(task, path.resolve(), instruction, config, tests, binary, executables, solution, extra)


def is_task_folder(path: Path) -> bool:
    return (Path(path) / "task.toml").is_file()


def load_harbor(paths: list[Path] | list[str]) -> list[HarborTask]:
    """Every task of ``paths`` (task folders, or folders of task folders), all checked before any is returned."""
    tasks: list[HarborTask] = []
    for given in paths:
        path = Path(given)
        if not path.is_dir():
            raise InvalidRequest(f"{path}: not a folder (a Harbor task folder or a folder of them)", field="path")
        if is_task_folder(path):
            tasks.append(read_task(path))
            continue
        children = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
        for child in children:
            if child.is_symlink() and (reason := _escapes(child, path.resolve(), f"{path}")):
                raise _bad(child.name, str(child), f"the task folder is a symlink: {reason}")
        found = [read_task(child) for child in children if is_task_folder(child) or (child / "instruction.md").exists()]
        if not found:
            raise InvalidRequest(f"{path}: no Harbor task folders (a folder with task.toml) in it", field="path")
        tasks.extend(found)
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise InvalidRequest(f"harbor task {task.task_id}: imported twice", field="path")
        seen.add(task.task_id)
    return tasks
