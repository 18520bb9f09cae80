"""The one clock: timezone-aware UTC, the time every row's timestamps and deadlines are written in."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    return datetime.now(UTC)
