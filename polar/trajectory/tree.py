"""One rollout's capture tree over ``CaptureRecord``s: validated order, links that step over failed calls, and
full prompts rebuilt on demand.

The contract is the store's (``db.models.Capture``): ``full_prompt(c) = sequence(parent)[:c.prefix_len] +
c.prompt_delta_ids`` with ``sequence(p) = full_prompt(p) + p.output_ids``. Prompt *lengths* follow from that
without materialising anything, and they are all the merge decisions need; whole prompts are built only where a
trace starts (and for ``per_request``, for every capture), replaying from the nearest prompt already built, so
a long session costs its tokens once per materialised prompt rather than once per ancestor.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from db.capture_tree import CaptureTreeError
from polar.trajectory.records import CaptureRecord


@dataclass(frozen=True)
class Link:
    """How an OK capture's prompt extends its nearest successful ancestor ``parent``.

    ``full_prompt(capture) = sequence(parent)[:prefix_len] + delta``. When the direct parent is a failed call
    (which has no reply to train on) the link goes through it to the ancestor it extended, with the shared
    prefix shrunk to what both kept and the failed call's own tokens moved into ``delta``. ``parent`` is
    ``None`` for a root, or when no ancestor succeeded (``through_failed`` then says the capture had a parent).
    """

    parent: CaptureRecord | None
    prefix_len: int
    delta: Sequence[int]
    through_failed: bool = False


class CaptureTree:
    """The captures of one rollout, ordered by ``seq`` and checked against the tree contract.

    Raises ``CaptureTreeError`` for duplicate ids or seqs, a parent outside the rollout or not earlier than its
    child (which also rules out cycles), a root with a prefix, or a prefix longer than the parent's sequence.
    """

    def __init__(self, captures: Iterable[CaptureRecord]):
        self.records: list[CaptureRecord] = sorted(captures, key=lambda c: c.seq)
        self.ok: list[CaptureRecord] = [record for record in self.records if record.ok]
        self.by_id: dict[int, CaptureRecord] = {}
        self._prompt_len: dict[int, int] = {}
        self._prompts: dict[int, tuple[int, ...]] = {}
        seqs: set[int] = set()
        for record in self.records:
            if record.id in self.by_id or record.seq in seqs:
                raise CaptureTreeError(f"capture {record.id} (seq {record.seq}) repeats an id or a seq")
            self._check_link(record)
            self.by_id[record.id] = record
            seqs.add(record.seq)
            self._prompt_len[record.id] = record.prefix_len + len(record.prompt_delta_ids)

    def _check_link(self, record: CaptureRecord) -> None:
        if record.parent_id is None:
            if record.prefix_len != 0:
                raise CaptureTreeError(f"capture {record.id} is a root but has prefix_len {record.prefix_len}")
            return
        parent = self.by_id.get(record.parent_id)
        if parent is None:
            # Records arrive sorted by seq, so a parent not seen yet is missing or not earlier than its child.
            raise CaptureTreeError(
                f"capture {record.id}: parent {record.parent_id} is not an earlier capture of the same rollout"
            )
        if record.prefix_len > self.sequence_len(parent):
            raise CaptureTreeError(
                f"capture {record.id} has prefix_len {record.prefix_len} but its parent sequence has "
                f"{self.sequence_len(parent)} tokens"
            )

    def prompt_len(self, record: CaptureRecord) -> int:
        return self._prompt_len[record.id]

    def sequence_len(self, record: CaptureRecord) -> int:
        """Prompt plus output: what a child's ``prefix_len`` is measured against."""
        return self._prompt_len[record.id] + len(record.output_ids)

    def link(self, record: CaptureRecord) -> Link:
        """The link from ``record`` to its nearest successful ancestor (see ``Link``)."""
        prefix_len = record.prefix_len
        delta: Sequence[int] = record.prompt_delta_ids
        parent_id = record.parent_id
        through_failed = False
        while parent_id is not None:
            parent = self.by_id[parent_id]
            if parent.ok:
                return Link(parent, prefix_len, delta, through_failed)
            # sequence(failed) = sequence(grandparent)[:k_f] + rest, with rest = its delta and any output.
            rest = (*parent.prompt_delta_ids, *parent.output_ids)
            kept = rest[: max(0, prefix_len - parent.prefix_len)]
            delta = (*kept, *delta)
            prefix_len = min(prefix_len, parent.prefix_len)
            parent_id = parent.parent_id
            through_failed = True
        return Link(None, 0, delta, through_failed)

    def full_prompt(self, record: CaptureRecord) -> tuple[int, ...]:
        """The full prompt ids of ``record`` (memoised), replayed from the nearest memoised ancestor or root."""
        known = self._prompts.get(record.id)
        if known is not None:
            return known
        path = [record]
        while path[-1].parent_id is not None and path[-1].parent_id not in self._prompts:
            path.append(self.by_id[path[-1].parent_id])
        top = path[-1]
        sequence: list[int] = []
        if top.parent_id is not None:
            parent = self.by_id[top.parent_id]
            sequence = [*self._prompts[parent.id], *parent.output_ids]
        previous: CaptureRecord | None = None
        # Replay in place on one list: truncate to the kept prefix, append the delta, then the output.
        for node in reversed(path):
            if previous is not None:
                sequence.extend(previous.output_ids)
            del sequence[node.prefix_len :]
            sequence.extend(node.prompt_delta_ids)
            previous = node
        prompt = tuple(sequence)
        self._prompts[record.id] = prompt
        return prompt
