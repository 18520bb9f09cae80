"""Weight versions as the trainer feed counts them: an ordinal per registered version, the newest is current.

A version's ordinal is its position among ``weight_versions`` rows by id (1 = the first registered). A version
the store never registered (the label a backend started with, e.g. ``default``) has ordinal 0. Staleness of a
sample is ``current ordinal - ordinal of the oldest version it was sampled under``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.models import WeightVersion
from polar.errors import Conflict, InvalidRequest


@dataclass(frozen=True)
class VersionRecord:
    version: str
    ordinal: int
    created_at: datetime
    checkpoint_uri: str | None
    notes: str | None


def ordinals(db: Session) -> dict[str, int]:
    """Every registered version -> its ordinal (1-based, in registration order)."""
    names = db.scalars(sa.select(WeightVersion.version).order_by(WeightVersion.id)).all()
    return {name: index for index, name in enumerate(names, start=1)}


def current(db: Session) -> VersionRecord | None:
    """The newest registered version, or None before the first registration."""
    count = db.scalar(sa.select(sa.func.count()).select_from(WeightVersion)) or 0
    row = db.scalars(sa.select(WeightVersion).order_by(WeightVersion.id.desc()).limit(1)).first()
    return _record(row, count) if row is not None else None


def list_versions(factory: sessionmaker[Session]) -> list[VersionRecord]:
    with factory() as db:
        rows = db.scalars(sa.select(WeightVersion).order_by(WeightVersion.id)).all()
        return [_record(row, index) for index, row in enumerate(rows, start=1)]


def register(
    factory: sessionmaker[Session], version: str, *, checkpoint_uri: str | None = None, notes: str | None = None
) -> VersionRecord:
    """Record ``version`` as the new current version. A name already registered is a ``Conflict``."""
    if not version or len(version) > 128:
        raise InvalidRequest("version must be 1 to 128 characters", field="version")
    try:
        with session_scope(factory) as db:
            row = WeightVersion(version=version, checkpoint_uri=checkpoint_uri, notes=notes)
            db.add(row)
            db.flush()
            ordinal = db.scalar(sa.select(sa.func.count()).where(WeightVersion.id <= row.id)) or 1
            db.refresh(row)
            return _record(row, ordinal)
    except IntegrityError:
        raise Conflict(f"weight version {version!r} is already registered", field="version") from None


def _record(row: WeightVersion, ordinal: int) -> VersionRecord:
    return VersionRecord(row.version, ordinal, row.created_at, row.checkpoint_uri, row.notes)
