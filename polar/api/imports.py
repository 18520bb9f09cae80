"""``POST /v1/tasks/import``: benchmark tasks named by a path on the API's host, read into TaskRequests.

A remote caller names what the server can already read: a Harbor task folder (or a folder of them) or a
SWE-bench ``.jsonl`` file. The path must lie inside ``POLAR_COPY_ROOTS``, the host folders a task may read from
anyway (a Harbor task's files are copied into its runtime from there), so the API never reads a file it could
not hand to a task. Every task is read and checked before any is submitted (``polar.tasks``): a bad folder or
instance is a 400 naming the task and its field; a path that is missing or outside the roots names ``path``.
Uploading task contents is not offered: a Harbor task's ``environment/`` build context and tests live on the
host that builds its image, which is this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from polar.api.schemas.requests import RequestBody
from polar.errors import InvalidRequest, PermissionDenied, PrepareFailed
from polar.rollout.prepare import allowed_source
from polar.rollout.spec import HarnessSpec, TaskRequest, parse_task_request
from polar.settings import Settings
from polar.tasks import load_benchmark


class TaskImport(RequestBody):
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="on the API's host, inside POLAR_COPY_ROOTS: a Harbor task folder (or a folder of them) or a "
        "SWE-bench .jsonl file",
    )
    harness: HarnessSpec = Field(
        default_factory=lambda: HarnessSpec(name="mini_swe_agent"), description="who runs the tasks"
    )
    samples: int = Field(default=1, ge=1, le=4096, description="samples per task (its group size)")
    policies: list[dict[str, Any]] | None = Field(default=None, description="scripted gateway policies (tests)")
    image_template: str | None = Field(default=None, max_length=512, description="SWE-bench image naming override")
    repos: str | None = Field(
        default=None,
        max_length=4096,
        description="local clones (inside POLAR_COPY_ROOTS) each instance's test and gold patch must apply in",
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="added to every task's metadata (group, step)")


def _inside(value: str, field: str, settings: Settings) -> Path:
    if "\x00" in value:  # no file system path holds one (the OS refuses it: a 500 if it got that far)
        raise InvalidRequest(f"{field}: a path has no NUL character", field=field)
    try:
        path = allowed_source(value, settings.copy_root_paths)
    except PrepareFailed as exc:
        raise PermissionDenied(f"{field}: {exc.message}", field=field) from None
    if not path.exists():
        raise InvalidRequest(f"{field}: {value} does not exist on the API's host", field=field)
    return path


def import_requests(body: TaskImport, settings: Settings) -> list[TaskRequest]:
    """The TaskRequests of ``body.path``, all checked; nothing is returned when one task is bad."""
    path = _inside(body.path, "path", settings)
    if not path.is_dir() and path.suffix != ".jsonl":
        raise InvalidRequest(
            f"path: {body.path} is neither a Harbor task folder nor a SWE-bench .jsonl file", field="path"
        )
    repos = _inside(body.repos, "repos", settings) if body.repos else None
    tasks = load_benchmark([path], image_template=body.image_template, repos=repos)
    harness = body.harness.model_dump(exclude_none=True)
    requests = []
    for task in tasks:
        request = task.request(harness, samples=body.samples, policies=body.policies)
        request["metadata"] = {**request.get("metadata", {}), **body.metadata}
        requests.append(parse_task_request(request))
    return requests
