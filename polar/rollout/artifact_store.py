"""Rollout artifacts any host can read: what a later stage needs once the runtime folder is out of reach.

A rollout's postrun or evaluate may run on another host than its run (its worker died, the retry ran elsewhere),
where the runtime folder does not exist. So as soon as the harness has ended, the run stage keeps
(``keep_artifacts``): the agent's changes (``diff.patch``, git's binary diff; ``work.tar.gz`` of the working
folder when it is not a git repository), the files the evaluator reads (``work/<path>`` for each of the
evaluator's ``copy_paths``) and the harness's logs (``logs/harness.stdout``, ``logs/harness.stderr``).

Where: in the store by default (``rollout_artifacts.content``, at most ``POLAR_ARTIFACT_MAX_BYTES`` each), or
under ``POLAR_ARTIFACT_URL`` (a folder on shared storage or any fsspec URL; ``<url>/<rollout id>/<name>``, no
cap), with its size and SHA-256 in the row either way. A file over the cap is listed as not stored, with why.
``load`` of an artifact that was never stored, or whose bytes are gone or altered, raises ``ArtifactMissing``
naming it: the stage fails, it never grades an empty folder.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.models import RolloutArtifact
from db.stage_reports import KeptArtifact
from polar.errors import ArtifactMissing
from polar.settings import Settings

LOG_FILES = ("harness.stdout", "harness.stderr")


def _location(settings: Settings, rollout_id: str, name: str) -> str:
    return f"{settings.artifact_url.rstrip('/')}/{rollout_id}/{name}"


def save(factory: sessionmaker[Session], settings: Settings, rollout_id: str, name: str, data: bytes) -> KeptArtifact:
    """Keep ``data`` as ``name`` of the rollout (replacing an earlier one); returns its manifest entry."""
    size, sha256 = len(data), hashlib.sha256(data).hexdigest()
    content: bytes | None = data
    url: str | None = None
    if settings.artifact_url:
        import fsspec

        url, content = _location(settings, rollout_id, name), None
        with fsspec.open(url, "wb", auto_mkdir=True) as out:
            out.write(data)
    elif size > settings.artifact_max_bytes:
        reason = f"{size} bytes is over POLAR_ARTIFACT_MAX_BYTES"
        return KeptArtifact(size=size, sha256=sha256, stored=False, reason=reason)
    with session_scope(factory) as db:
        db.execute(
            sa.delete(RolloutArtifact).where(RolloutArtifact.rollout_id == rollout_id, RolloutArtifact.name == name)
        )
        db.add(RolloutArtifact(rollout_id=rollout_id, name=name, size=size, sha256=sha256, content=content, url=url))
    if url is None:  # the entry names a URL only when there is one
        return KeptArtifact(size=size, sha256=sha256, stored=True)
    return KeptArtifact(size=size, sha256=sha256, url=url, stored=True)


def load(factory: sessionmaker[Session], rollout_id: str, name: str, *, why: str = "") -> bytes:
    """The bytes of artifact ``name``; ``ArtifactMissing`` (naming it) when it was not stored or is unreadable."""
    with factory() as db:
        row = db.scalar(
            sa.select(RolloutArtifact).where(RolloutArtifact.rollout_id == rollout_id, RolloutArtifact.name == name)
        )
    context = f" ({why})" if why else ""
    if row is None:
        raise ArtifactMissing(f"rollout {rollout_id}: artifact {name} was never stored{context}", field=name)
    data = row.content
    if data is None and row.url:
        import fsspec

        try:
            with fsspec.open(row.url, "rb") as source:
                data = source.read()
        except OSError as exc:
            raise ArtifactMissing(f"rollout {rollout_id}: artifact {name} at {row.url} is unreadable: {exc}") from None
    if data is None or hashlib.sha256(data).hexdigest() != row.sha256:
        raise ArtifactMissing(f"rollout {rollout_id}: artifact {name} is gone or altered{context}", field=name)
    return data


def tar_folder(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(folder, arcname=".")
    return buffer.getvalue()


def untar_into(data: bytes, folder: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        archive.extractall(folder, filter="data")
