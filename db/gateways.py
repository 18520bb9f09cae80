"""The gateway registry: every running gateway replica has a row in ``gateways`` and refreshes its heartbeat;
the control API pushes new weights to the live ones (heartbeat within ``stale_after_s``, not stopped).

Times are passed in (``at``), so this module needs nothing above ``db``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.engine import session_scope
from db.models import Gateway


def register(factory: sessionmaker[Session], gateway_id: str, url: str, at: datetime) -> None:
    """Add (or restart) replica ``gateway_id`` reachable at ``url``. Processes registering one id at once (the
    workers of ``polar gateway --workers N`` share their URL) all succeed: the one that loses the insert updates."""
    for attempt in range(2):
        try:
            with session_scope(factory) as db:
                row = db.get(Gateway, gateway_id)
                if row is None:
                    db.add(Gateway(id=gateway_id, url=url, started_at=at, heartbeat_at=at))
                else:
                    row.url, row.started_at, row.heartbeat_at, row.stopped_at, row.draining_at = url, at, at, None, None
            return
        except sa.exc.IntegrityError:
            if attempt:
                raise


def heartbeat(factory: sessionmaker[Session], gateway_id: str, at: datetime) -> None:
    with session_scope(factory) as db:
        db.execute(sa.update(Gateway).where(Gateway.id == gateway_id).values(heartbeat_at=at))


def drain(factory: sessionmaker[Session], gateway_id: str, at: datetime) -> None:
    """The replica began shutting down: it finishes the calls it holds and takes no new ones. It stays a row (and
    keeps its heartbeat) until ``deregister``; it is no longer a weight target."""
    with session_scope(factory) as db:
        db.execute(
            sa.update(Gateway)
            .where(Gateway.id == gateway_id, Gateway.draining_at.is_(None))
            .values(draining_at=at, heartbeat_at=at)
        )


def deregister(factory: sessionmaker[Session], gateway_id: str, at: datetime) -> None:
    """The replica stopped on purpose: it is no longer a weight target."""
    with session_scope(factory) as db:
        db.execute(sa.update(Gateway).where(Gateway.id == gateway_id).values(stopped_at=at))


def live(factory: sessionmaker[Session], at: datetime, stale_after_s: float) -> list[tuple[str, str]]:
    """(id, url) of every replica that is running and sent a heartbeat within ``stale_after_s``."""
    with factory() as db:
        rows = db.execute(
            sa.select(Gateway.id, Gateway.url)
            .where(
                Gateway.stopped_at.is_(None),
                Gateway.draining_at.is_(None),
                Gateway.heartbeat_at >= at - timedelta(seconds=stale_after_s),
            )
            .order_by(Gateway.started_at, Gateway.id)
        ).all()
    return [(row.id, row.url) for row in rows]
