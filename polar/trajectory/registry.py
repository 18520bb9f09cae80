"""The builder registry: a name (stored in ``tasks.builder`` and ``trajectories.builder``) to a pure builder.

A new builder is a function ``(captures, /) -> BuildResult`` (``Builder`` below) added here;
the store, ``rebuild`` and the CLI reach it by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from polar.errors import InvalidRequest
from polar.trajectory.per_request import NAME as PER_REQUEST
from polar.trajectory.per_request import per_request
from polar.trajectory.prefix_merge import NAME as PREFIX_MERGE
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.records import BuildResult, CaptureRecord
from polar.trajectory.roles import SessionRoles


class Builder(Protocol):
    """A pure function from one rollout's captures (any order) to its traces and merge statistics; ``roles``
    labels the chains, else they are labelled by tree shape alone."""

    def __call__(self, captures: Iterable[CaptureRecord], /, *, roles: SessionRoles | None = None) -> BuildResult: ...


BUILDERS: dict[str, Builder] = {PER_REQUEST: per_request, PREFIX_MERGE: prefix_merge}


def get_builder(name: str) -> Builder:
    """The builder registered as ``name``; ``InvalidRequest`` naming the known ones otherwise."""
    try:
        return BUILDERS[name]
    except KeyError:
        raise InvalidRequest(
            f"unknown trajectory builder {name!r}; known: {', '.join(BUILDERS)}", field="builder"
        ) from None
