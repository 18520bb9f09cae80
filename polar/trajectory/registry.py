"""The builder registry: a name (stored in ``tasks.builder`` and ``trajectories.builder``) to a pure builder.

A new builder is a function ``(captures, /) -> BuildResult`` (``polar.trajectory.records.Builder``) added here;
the store, ``rebuild`` and the CLI reach it by name.
"""

from __future__ import annotations

from polar.errors import InvalidRequest
from polar.trajectory.per_request import NAME as PER_REQUEST
from polar.trajectory.per_request import per_request
from polar.trajectory.prefix_merge import NAME as PREFIX_MERGE
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.records import Builder

BUILDERS: dict[str, Builder] = {PER_REQUEST: per_request, PREFIX_MERGE: prefix_merge}


def get_builder(name: str) -> Builder:
    """The builder registered as ``name``; ``InvalidRequest`` naming the known ones otherwise."""
    try:
        return BUILDERS[name]
    except KeyError:
        raise InvalidRequest(
            f"unknown trajectory builder {name!r}; known: {', '.join(BUILDERS)}", field="builder"
        ) from None
