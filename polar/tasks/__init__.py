"""Benchmark tasks in their own formats, read into ordinary TaskRequests.

- ``harbor``: Harbor task folders (``task.toml``, ``instruction.md``, ``environment/``, ``tests/``, ``solution/``).
- ``swebench``: SWE-bench-style instances (JSONL), images named by a per-dataset template.
- ``check``: a dataset's oracle and no-op runs, judged (an oracle must score 1, a no-op 0).
- (``polar tasks import|check`` on the command line is ``polar.cli.tasks``.)

``load_tasks`` is what ``polar run`` reads: a JSON file of TaskRequests, a JSONL file of SWE-bench instances, or a
Harbor task folder (or a folder of them), each task becoming one TaskRequest with ``samples`` samples of the
given harness.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polar.errors import InvalidRequest
from polar.tasks.check import Checkable
from polar.tasks.harbor import HarborTask, is_task_folder, load_harbor, read_task
from polar.tasks.swebench import SWEbenchInstance, load_swebench


def load_benchmark(
    paths: Sequence[str | Path], *, image_template: str | None = None, repos: str | Path | None = None
) -> list[Checkable]:
    """Harbor tasks (folders) and SWE-bench instances (``.jsonl`` files), all checked before any is returned;
    ``repos``: local clones the instances' patches are applied in (``polar.tasks.patches``)."""
    tasks: list[Checkable] = []
    for given in paths:
        path = Path(given)
        if path.suffix == ".jsonl":
            tasks.extend(load_swebench(path, template=image_template, repos=repos))
        else:
            tasks.extend(load_harbor([path]))
    return tasks


def load_tasks(
    path: str | Path,
    *,
    harness: dict[str, Any] | None = None,
    samples: int | None = None,
    policies: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The TaskRequests (as dicts) of ``path``: a JSON file (one request or a list), a JSONL file of SWE-bench
    instances, or Harbor task folders."""
    path = Path(path)
    if path.is_dir() or path.suffix == ".jsonl":
        # Benchmark tasks run in their own images, which lack Polar's Python agent: mini-swe-agent by default.
        chosen = harness or {"name": "mini_swe_agent"}
        return [task.request(chosen, samples=samples or 1, policies=policies) for task in load_benchmark([path])]
    if not path.is_file():
        raise InvalidRequest(f"{path}: no such file or folder", field="tasks")
    try:
        tasks = json.loads(path.read_text())
    except ValueError as exc:
        raise InvalidRequest(f"{path}: not JSON: {exc}", field="tasks") from None
    tasks = tasks if isinstance(tasks, list) else [tasks]
    if samples is not None:
        tasks = [{**task, "num_samples": samples} for task in tasks]
    return tasks


__all__ = [
    "HarborTask",
    "SWEbenchInstance",
    "is_task_folder",
    "load_benchmark",
    "load_harbor",
    "load_swebench",
    "load_tasks",
    "read_task",
]
