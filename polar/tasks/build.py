"""``polar tasks build``: each task's image made ready on the Docker engine before a batch needs it, its tag printed.

A task whose runtime builds its image (a Harbor task's ``environment/``) gets the tag the docker runtime will look
for, ``polar-task/<name>:<context hash>`` (``polar.runtime.images``): built now unless the engine has it, on the
build network (``--network``, else the task's own, else ``POLAR_DOCKER_BUILD_NETWORK``). ``adopt`` takes an image
built outside Polar (``docker build -t mine .`` with whatever the Dockerfile needs) as that task's image: it is
tagged with Polar's tag, so every rollout of the task runs in it. A task that names its image (``[environment]
docker_image``) is only looked up: Polar never pulls. A SWE-bench instance's missing image is built from a local
clone when ``repos`` is given (``polar.tasks.swe_images``: the repository at ``/testbed`` at the base commit, FROM
``from_image``). Each task gets one ``Readiness`` line; a failure names its cause and stops nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from polar.errors import InvalidRequest, PolarError
from polar.runtime.images import BuildSpec, ensure_image, has_image, image_tag
from polar.tasks.check import Checkable
from polar.tasks.patches import find_repo
from polar.tasks.swe_images import build_instance_image
from polar.tasks.swebench import SWEbenchInstance

# Any harness will do: only the runtime part of the request is read.
_ANY_HARNESS = {"name": "command", "config": {"command": "true", "model_calls": "none"}}


class ImageState(StrEnum):
    BUILT = "built"
    PRESENT = "present"  # on the engine already (built earlier, or a named image)
    ADOPTED = "adopted"
    MISSING = "missing"  # a named image the engine does not have
    FAILED = "failed"


@dataclass(frozen=True)
class Readiness:
    task_id: str
    image: str
    state: ImageState
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.state not in (ImageState.MISSING, ImageState.FAILED)


@dataclass(frozen=True)
class BuildPlan:
    """How ``make_ready`` builds: the network (None: the task's, else ``default_network``), where the build logs
    go, and for SWE-bench instances the local clones and the image their images are built FROM."""

    logs: Path
    network: str | None = None
    default_network: str = "none"
    repos: Path | None = None
    from_image: str = "polar/base:bookworm"


def _named(client: Any, task: Checkable, image: str, plan: BuildPlan) -> Readiness:
    if has_image(client, image):
        return Readiness(task.task_id, image, ImageState.PRESENT)
    if not isinstance(task, SWEbenchInstance):
        return Readiness(task.task_id, image, ImageState.MISSING, "not on this engine (Polar never pulls: load it)")
    if plan.repos is None:
        return Readiness(task.task_id, image, ImageState.MISSING, "build it from a local clone: --repos DIR")
    base = str(task.raw["base_commit"])
    started = time.monotonic()
    try:
        repo = find_repo(plan.repos, str(task.raw["repo"]), base)
        build_instance_image(client, repo, base, image, plan.from_image, network=plan.network or plan.default_network)
    except PolarError as exc:
        return Readiness(task.task_id, image, ImageState.FAILED, exc.message)
    return Readiness(task.task_id, image, ImageState.BUILT, f"{time.monotonic() - started:.1f} s")


def _ready(client: Any, task: Checkable, plan: BuildPlan) -> Readiness:
    options = task.request(_ANY_HARNESS)["runtime"]["options"]
    if options.get("build") is None:
        return _named(client, task, options.get("image") or "", plan)
    spec = BuildSpec.model_validate(options["build"])
    tag = image_tag(spec)
    if has_image(client, tag):
        return Readiness(task.task_id, tag, ImageState.PRESENT)
    started = time.monotonic()
    try:
        ensure_image(client, spec, plan.logs, network=plan.network or spec.network or plan.default_network)
    except PolarError as exc:
        return Readiness(task.task_id, tag, ImageState.FAILED, exc.message)
    return Readiness(task.task_id, tag, ImageState.BUILT, f"{time.monotonic() - started:.1f} s")


def make_ready(
    client: Any, tasks: Sequence[Checkable], plan: BuildPlan, *, adopt: str | None = None
) -> list[Readiness]:
    """Each task's image ready (see the module's docstring); ``adopt`` needs exactly one task that builds."""
    if adopt is None:
        return [_ready(client, task, plan) for task in tasks]
    if len(tasks) != 1:
        raise InvalidRequest(f"--adopt takes one task, not {len(tasks)}", field="--adopt")
    (task,) = tasks
    build = task.request(_ANY_HARNESS)["runtime"]["options"].get("build")
    if build is None:
        raise InvalidRequest(
            f"task {task.task_id} names its image ([environment] docker_image): there is nothing to adopt",
            field="--adopt",
        )
    tag = image_tag(BuildSpec.model_validate(build))
    if not has_image(client, adopt):
        return [Readiness(task.task_id, tag, ImageState.FAILED, f"image {adopt!r} is not on this engine")]
    repository, _, version = tag.rpartition(":")
    client.images.get(adopt).tag(repository, version)
    return [Readiness(task.task_id, tag, ImageState.ADOPTED, f"from {adopt}")]


def format_readiness(rows: Sequence[Readiness]) -> str:
    width = max([len("task"), *(len(r.task_id) for r in rows)])
    lines = [f"{'task':<{width}}  {'state':<8} image"]
    for row in rows:
        detail = f"  ({row.detail})" if row.detail else ""
        lines.append(f"{row.task_id:<{width}}  {row.state.value:<8} {row.image}{detail}")
    return "\n".join(lines)
