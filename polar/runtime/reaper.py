"""Removes Docker containers that no live rollout owns: the cleanup of last resort after crashes.

Every container of the docker runtime carries the labels ``polar.runtime``, ``polar.key``, ``polar.root`` (its
runtime folder on the host) and ``polar.created`` (unix time). A container is an orphan when it has stopped (its
maker died, so its lifeline closed: ``polar.runtime.lifeline``; removing it loses nothing, its files are on the
host and a later stage makes a new one), when its folder is gone (the rollout finished and was cleaned up, or a
crashed process left only the container) or, with ``max_age_s``, when it is older than that. ``polar runtime
reap`` runs this; schedule it, or run it after a crash. A container not started yet (``created``) does not count
as stopped: its maker may be about to start it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from polar.runtime import lifeline
from polar.runtime.docker_engine import LABEL, docker_client

STOPPED = ("exited", "dead")


@dataclass(frozen=True)
class Reaped:
    name: str
    reason: str


def reap_orphans(*, docker_host: str = "", max_age_s: float | None = None, root: Path | None = None) -> list[Reaped]:
    """Remove orphaned polar containers (only those under ``root`` when given); returns what was removed."""
    client = docker_client(docker_host)
    removed = []
    now = time.time()
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        labels = container.labels
        folder = Path(labels.get("polar.root", ""))
        if root is not None and not folder.is_relative_to(root):
            continue
        age = now - float(labels.get("polar.created") or 0)
        if container.status in STOPPED:
            reason = f"it has stopped ({container.status})"
        elif not folder.is_dir():
            reason = f"its runtime folder {folder} is gone"
        elif max_age_s is not None and age > max_age_s:
            reason = f"it is {age:.0f} s old (limit {max_age_s:g} s)"
        else:
            continue
        with contextlib.suppress(Exception):
            container.remove(force=True)
            removed.append(Reaped(container.name, reason))
        lifeline.release(container.name)
    return removed
