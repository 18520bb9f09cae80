"""``polar verify``'s check of what the trainer reads: each stored ``trajectories`` row against its captures.

The row's builder is run again over the rollout's captures (the same records and chain labels a build reads) and
the row is compared, position by position, with the trace it gives for the same chain of captures:

- **ids**: the prompt and every response id; a sampled position is named by its capture and its position in
  that capture's output (``capture 12 position 3``), an inserted one (tool result, user turn, template glue) by
  its response position and the capture it precedes;
- **logprobs**: every sampled position whose stored logprob is off the capture's by more than the tolerance;
- **mask**: the builder's mask, except that a row the training filter or the role choice zeroed (mask all 0,
  ``filter_reason`` set) is accepted as zeroed: those filters only ever zero a whole row, and say why.

A row whose chain the captures no longer give, or whose captures break the tree contract, fails as a whole.
Where each capture's output sits in the row (``Segment``) is kept so the engine can re-score the row's own
tokens (``polar.trajectory.verify``). The layout follows the builders' rules (``per_request``: the capture's
output is the response; ``prefix_merge``: each merged call's delta, or for a conditioning-inexact merge the
delta from the re-rendered turn's close, then its output); a row of any other builder is compared as a whole,
by response position, and not re-scored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db import Capture, Trajectory
from polar.errors import PolarError
from polar.trajectory.prefix_merge import detect_end_of_turn
from polar.trajectory.records import CaptureRecord, Trace
from polar.trajectory.registry import get_builder
from polar.trajectory.roles import SessionRoles
from polar.trajectory.store import load_session_roles
from polar.trajectory.tree import CaptureTree


@dataclass(frozen=True)
class StoredRow:
    """The columns of one ``trajectories`` row a trainer reads, and what names it."""

    id: int
    builder: str
    chain_index: int
    capture_ids: tuple[int, ...]
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    response_logprobs: tuple[float, ...]
    filter_reason: str | None

    @property
    def name(self) -> str:
        return f"trajectory {self.id} ({self.builder} chain {self.chain_index})"

    @classmethod
    def from_row(cls, row: Any) -> StoredRow:
        return cls(
            id=row.id,
            builder=row.builder,
            chain_index=row.chain_index,
            capture_ids=tuple(int(i) for i in row.capture_ids),
            prompt_ids=tuple(row.prompt_ids),
            response_ids=tuple(row.response_ids),
            loss_mask=tuple(row.loss_mask),
            response_logprobs=tuple(float(x) for x in row.response_logprobs),
            filter_reason=row.filter_reason,
        )


@dataclass(frozen=True)
class Segment:
    """Capture ``capture_id``'s output sits at ``[offset, offset + length)`` of the row's response.
    ``exact``: the row's context before it is the capture's own prompt (the chain's first call, or only
    conditioning-exact merges up to it); after an inexact merge the row holds the sampled ids where the capture's prompt
    held a re-rendering."""

    capture_id: int
    offset: int
    length: int
    exact: bool


@dataclass(frozen=True)
class RowCheck:
    """One stored row, where its captures' outputs sit in it (empty: unknown) and where it is not what its
    captures give."""

    row: StoredRow
    segments: tuple[Segment, ...]
    problems: tuple[str, ...]


def load_rows(db: Session, rollout_id: str) -> list[StoredRow]:
    """Every stored trajectory of ``rollout_id``, all builders, by builder and chain index."""
    rows = db.scalars(
        sa.select(Trajectory)
        .where(Trajectory.rollout_id == rollout_id)
        .order_by(Trajectory.builder, Trajectory.chain_index, Trajectory.id)
    )
    return [StoredRow.from_row(row) for row in rows]


def check_stored(db: Session, rollout_id: str, captures: Sequence[Capture], tolerance: float) -> list[RowCheck]:
    """Each stored trajectory of ``rollout_id`` against ``captures`` (its captures, ``seq`` order)."""
    rows = load_rows(db, rollout_id)
    if not rows:
        return []
    try:
        records = [CaptureRecord.from_row(capture) for capture in captures]
        roles = load_session_roles(db, rollout_id, records)
    except ValueError as exc:  # CaptureTreeError, or a record that cannot exist: nothing can be rebuilt
        return [RowCheck(row, (), (f"{row.name}: its captures cannot be built: {exc}",)) for row in rows]
    return check_rows(records, roles, rows, tolerance)


def check_rows(
    records: Sequence[CaptureRecord], roles: SessionRoles, rows: Sequence[StoredRow], tolerance: float
) -> list[RowCheck]:
    """``rows`` against what their builders make of ``records`` (module docstring)."""
    tree = CaptureTree(records)
    built: dict[str, dict[tuple[int, ...], Trace]] = {}
    checks: list[RowCheck] = []
    for row in rows:
        if row.builder not in built:
            try:
                traces = get_builder(row.builder)(records, roles=roles).traces
            except (PolarError, ValueError) as exc:
                checks.append(RowCheck(row, (), (f"{row.name}: not rebuilt from its captures: {exc}",)))
                continue
            built[row.builder] = {trace.capture_ids: trace for trace in traces}
        trace = built[row.builder].get(row.capture_ids)
        if trace is None:
            problem = f"{row.name}: its captures give no {row.builder} chain {list(row.capture_ids)}"
            checks.append(RowCheck(row, (), (problem,)))
            continue
        segments = layout(tree, trace, row.builder)
        checks.append(RowCheck(row, segments, tuple(compare(row, trace, segments, tolerance))))
    return checks


def layout(tree: CaptureTree, trace: Trace, builder: str) -> tuple[Segment, ...]:
    """Where each capture of ``trace`` has its output in the response (empty for an unknown builder, or when
    the builder's rules do not account for the whole response)."""
    if builder not in ("per_request", "prefix_merge"):
        return ()
    records = [tree.by_id[capture_id] for capture_id in trace.capture_ids]
    segments = [Segment(records[0].id, 0, len(records[0].output_ids), True)]
    for parent, child in zip(records, records[1:], strict=False):
        inserted, exact = _inserted(tree, parent, child)
        if inserted is None:
            return ()
        start = segments[-1].offset + segments[-1].length + inserted
        # One inexact merge and every later call's context in the row differs from the prompt it was sampled on.
        segments.append(Segment(child.id, start, len(child.output_ids), exact and segments[-1].exact))
    last = segments[-1]
    return tuple(segments) if last.offset + last.length == len(trace.response_ids) else ()


def _inserted(tree: CaptureTree, parent: CaptureRecord, child: CaptureRecord) -> tuple[int | None, bool]:
    """How many tokens ``prefix_merge`` inserts between ``parent``'s output and ``child``'s, and whether the merge
    is conditioning-exact (the rules of ``prefix_merge._decide``; ``None``: the child does not merge there)."""
    link = tree.link(child)
    if link.parent is None or link.parent.id != parent.id:
        return None, False
    if link.prefix_len == tree.sequence_len(parent):
        return len(link.delta), True
    eot = detect_end_of_turn(tree)
    if eot is None or eot not in link.delta:
        return None, False
    close = list(link.delta).index(eot)
    start = close + 1 if parent.output_ids[-1:] == (eot,) else close
    return len(link.delta) - start, False


def compare(row: StoredRow, trace: Trace, segments: Sequence[Segment], tolerance: float) -> list[str]:
    """Every place where ``row`` is not ``trace`` (the builder's output from the captures), named."""
    problems = [f"{row.name} prompt position {i}: {d}" for i, d in _id_diffs(row.prompt_ids, trace.prompt_ids)]
    if len(row.prompt_ids) != len(trace.prompt_ids):
        problems.append(
            f"{row.name}: prompt has {len(row.prompt_ids)} tokens, its captures give {len(trace.prompt_ids)}"
        )
    n = len(row.response_ids)
    if len(trace.response_ids) != n:
        problems.append(f"{row.name}: response has {n} tokens, its captures give {len(trace.response_ids)}")
    if len(row.loss_mask) != n or len(row.response_logprobs) != n:
        problems.append(
            f"{row.name}: response {n}, mask {len(row.loss_mask)} and logprobs {len(row.response_logprobs)} "
            "tokens do not align"
        )
    where = _positions(segments)
    zeroed = row.filter_reason is not None and not any(row.loss_mask)
    expected_mask = (0,) * len(trace.loss_mask) if zeroed else trace.loss_mask
    for i, diff in _id_diffs(row.response_ids, trace.response_ids):
        problems.append(f"{row.name} {where(i)}: {diff}")
    for i, (stored, built) in enumerate(zip(row.loss_mask, expected_mask, strict=False)):
        if stored != built:
            problems.append(f"{row.name} {where(i)}: mask stored {stored}, the builder gives {built}")
    sampled = {i for s in segments for i in range(s.offset, s.offset + s.length)} if segments else None
    for i, (stored_lp, built_lp) in enumerate(zip(row.response_logprobs, trace.response_logprobs, strict=False)):
        gap = abs(stored_lp - built_lp)
        if not gap <= tolerance and (sampled is None or i in sampled):  # NaN fails too
            problems.append(
                f"{row.name} {where(i)}: logprob stored {stored_lp:.6g}, capture {built_lp:.6g} (gap {gap:.3g})"
            )
    return problems


def _id_diffs(stored: Sequence[int], built: Sequence[int]) -> list[tuple[int, str]]:
    return [
        (i, f"stored id {a}, its captures give {b}")
        for i, (a, b) in enumerate(zip(stored, built, strict=False))
        if a != b
    ]


def _positions(segments: Sequence[Segment]) -> Callable[[int], str]:
    """A function naming response position ``i``: ``capture C position j`` on a capture's output, else the
    response position (and the capture it is inserted before)."""
    owner: dict[int, tuple[int, int]] = {}
    for s in segments:
        owner.update({s.offset + j: (s.capture_id, j) for j in range(s.length)})
    starts = [(s.offset, s.capture_id) for s in segments]

    def name(i: int) -> str:
        if i in owner:
            capture_id, j = owner[i]
            return f"capture {capture_id} position {j}"
        before = next((capture_id for offset, capture_id in starts if offset > i), None)
        inserted = f" (inserted before capture {before})" if before is not None else ""
        return f"response position {i}{inserted}"

    return name
