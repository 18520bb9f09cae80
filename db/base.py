"""The declarative base every table derives from, and the column helpers the tables share."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from db.types import UTCDateTime

# Deterministic constraint names, so migrations can refer to them (and SQLite batch mode can drop them).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only autoincrements an INTEGER PRIMARY KEY, not a BIGINT one.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


def status_column(enum_class: type[StrEnum]) -> sa.Enum:
    return sa.Enum(
        enum_class,
        native_enum=False,
        create_constraint=False,
        length=16,
        values_callable=lambda members: [member.value for member in members],
        validate_strings=True,
    )


def new_uuid() -> str:
    return str(uuid.uuid4())


def created_at_column() -> Mapped[datetime]:
    return mapped_column(UTCDateTime(), server_default=sa.func.now())


def rollout_fk(*, index: bool) -> Mapped[str]:
    return mapped_column(sa.String(36), sa.ForeignKey("rollouts.id", ondelete="CASCADE"), index=index)
