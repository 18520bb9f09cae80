"""The Docker engine as the ``docker`` runtime and the reaper reach it: one SDK client per engine, the options a
task gives the runtime, the label every Polar container carries, and the seeding of an image's WORKDIR."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from polar.errors import SandboxError
from polar.runtime.images import BuildSpec

LABEL = "polar.runtime"


class DockerOptions(BaseModel):
    """A task's ``runtime.options`` for the docker runtime."""

    model_config = ConfigDict(extra="forbid")
    image: str | None = Field(default=None, description="default POLAR_DOCKER_IMAGE")
    network: Literal["none", "host"] | None = Field(default=None, description="default POLAR_DOCKER_NETWORK")
    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, ge=16)
    pids_limit: int | None = Field(default=4096, ge=16)
    mount_tools: bool = Field(default=True, description="mount the tools folder (agent CLIs, Node) read-only")
    python: str = Field(default="python3", description="the image's interpreter: {python} in evaluator commands")
    build: BuildSpec | None = Field(default=None, description="build the image from a folder (polar.runtime.images)")
    seed_workdir: bool = Field(
        default=False,
        description="copy the image's WORKDIR into the work folder at the first start and link that path to it",
    )


@functools.cache
def docker_client(base_url: str = "") -> Any:
    """One SDK client per engine (``base_url`` empty: ``DOCKER_HOST`` or the default socket)."""
    import docker

    try:
        if base_url:
            return docker.DockerClient(base_url=base_url, max_pool_size=64)
        return docker.DockerClient.from_env(max_pool_size=64)
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot reach the Docker engine: {exc}") from None


def docker_available(base_url: str = "") -> str | None:
    """None when the engine answers, else why not (tests skip with it)."""
    try:
        docker_client(base_url).ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "not available", with its reason
        docker_client.cache_clear()
        return f"no Docker engine: {exc}"
    return None


def api_error(exc: Exception) -> str:
    """An SDK error as one line: the engine's explanation when it gave one."""
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc)


def seed_workdir(container: Any, workdir: str, work: str, marker: Path) -> None:
    """The image's WORKDIR becomes a link to the work folder, so the task's absolute paths (``/app``) and the
    harness's folder are one. Its content is copied in once per runtime (``marker``, in the private folder): a
    container made again on the same folder (a later stage in another process) only links it again."""
    if workdir in ("", "/", work):
        return
    script = (
        'w=$1 t=$2 m=$3; if [ ! -e "$m" ]; then if [ -d "$w" ] && [ ! -L "$w" ]; then cp -a "$w/." "$t/"; fi; '
        'touch "$m"; fi; rm -rf "$w"; mkdir -p "$(dirname "$w")"; ln -sfn "$t" "$w"'
    )
    code, output = container.exec_run(["sh", "-c", script, "seed", workdir, work, str(marker)])
    if code != 0:
        raise SandboxError(f"cannot link the image's WORKDIR {workdir} to {work}: {output.decode()[-300:]}")
