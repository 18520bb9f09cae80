"""Walk the capture tree: the chain of a capture up to its root, and its full prompt ids.

The contract is on ``db.models.Capture``: a capture stores only the prompt tokens its parent's sequence does
not already hold, so a full prompt is rebuilt by replaying the chain from the root. Each chain is loaded with
one recursive query (Postgres and SQLite both have ``WITH RECURSIVE``) and replayed in a loop, so a session
of thousands of turns needs neither thousands of queries nor deep Python recursion. Replay works in place on
one list, so its cost is linear in the chain's tokens rather than turns x context.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session, aliased

from db.models import Capture


class CaptureTreeError(ValueError):
    """Stored captures break the tree contract (a cycle, a prefix longer than its parent, a wrong count)."""


class TokenLink(Protocol):
    """What replaying needs of a capture; ``Capture`` rows and plain records both qualify."""

    @property
    def id(self) -> int: ...
    @property
    def prefix_len(self) -> int: ...
    @property
    def prompt_delta_ids(self) -> Sequence[int]: ...
    @property
    def output_ids(self) -> Sequence[int]: ...
    @property
    def n_prompt(self) -> int: ...


def prompt_from_chain(chain: Iterable[TokenLink]) -> list[int]:
    """Full prompt ids of the last capture of ``chain``, which runs from the root down, parent before child.

    Raises ``CaptureTreeError`` where the chain breaks the contract, including when a rebuilt prompt's length
    differs from the stored ``n_prompt``, so a bad write is caught the first time it is read.
    """
    sequence: list[int] = []
    previous: TokenLink | None = None
    for link in chain:
        if previous is not None:
            sequence.extend(previous.output_ids)  # now the parent sequence of ``link``
        elif link.prefix_len != 0:
            raise CaptureTreeError(f"capture {link.id} is a root but has prefix_len {link.prefix_len}")
        if link.prefix_len > len(sequence):
            raise CaptureTreeError(
                f"capture {link.id} has prefix_len {link.prefix_len} but its parent sequence has {len(sequence)} tokens"
            )
        del sequence[link.prefix_len :]
        sequence.extend(link.prompt_delta_ids)
        if len(sequence) != link.n_prompt:
            raise CaptureTreeError(
                f"capture {link.id} rebuilds to {len(sequence)} prompt tokens but records n_prompt={link.n_prompt}"
            )
        previous = link
    if previous is None:
        raise ValueError("empty capture chain")
    return sequence


def chain_to_root(session: Session, capture: Capture) -> list[Capture]:
    """``capture``, its parent, its grandparent, ..., its root, loaded in one query."""
    rows = session.scalars(_CHAIN_ROWS, {"leaf": _id_of(capture)}).all()
    return _order_leaf_first(capture, {row.id: row for row in rows})


def full_prompt_ids(session: Session, capture: Capture) -> list[int]:
    """The full prompt token ids of ``capture``, rebuilt from its chain (one query, only the token columns)."""
    rows = session.execute(_CHAIN_TOKENS, {"leaf": _id_of(capture)}).all()
    chain = _order_leaf_first(capture, {row.id: row for row in rows})
    return prompt_from_chain(reversed(chain))


class _ParentLinked(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def parent_id(self) -> int | None: ...


_Node = TypeVar("_Node", bound=_ParentLinked)


def _id_of(capture: Capture) -> int:
    if capture.id is None:
        raise ValueError("the capture has no id yet; flush the session before walking its tree")
    return capture.id


def _ancestors() -> sa.CTE:
    """A CTE of the ids of the capture ``:leaf`` and all its ancestors."""
    chain = (
        sa.select(Capture.id, Capture.parent_id).where(Capture.id == sa.bindparam("leaf")).cte("chain", recursive=True)
    )
    parent = aliased(Capture)
    # UNION, not UNION ALL: a (corrupt) cycle then ends the recursion instead of running forever, and the
    # walk below reports it.
    return chain.union(sa.select(parent.id, parent.parent_id).join(chain, parent.id == chain.c.parent_id))


# Built once: a statement constructed per call (an alias, a CTE) costs more than its cached execution, and leaves
# cyclic garbage behind it (an export reading a chain per row held ~16 MiB of it between collections).
_ANCESTORS = _ancestors()
_CHAIN_ROWS = sa.select(Capture).join(_ANCESTORS, Capture.id == _ANCESTORS.c.id)
_CHAIN_TOKENS = sa.select(
    Capture.id, Capture.parent_id, Capture.prefix_len, Capture.prompt_delta_ids, Capture.output_ids, Capture.n_prompt
).join(_ANCESTORS, Capture.id == _ANCESTORS.c.id)


def _order_leaf_first(capture: Capture, by_id: dict[int, _Node]) -> list[_Node]:
    chain: list[_Node] = []
    seen: set[int] = set()
    next_id: int | None = capture.id
    while next_id is not None:
        if next_id in seen:
            raise CaptureTreeError(f"capture {capture.id}: its parent links form a cycle through capture {next_id}")
        seen.add(next_id)
        try:
            node = by_id[next_id]
        except KeyError:
            raise CaptureTreeError(f"capture {capture.id}: ancestor capture {next_id} does not exist") from None
        chain.append(node)
        next_id = node.parent_id
    return chain
