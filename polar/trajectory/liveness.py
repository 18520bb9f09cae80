"""Which captures of a rollout may train: poisoned chains, dead retries, and the call the session ended on.

- **Poisoned**: a call the gateway admitted as ``unresolved`` (its history held assistant content no capture of
  the session produced there: ``polar.proxy.call.admission``), and every call after it on its chain. Kept and shown,
  never trained.
- **Retries** (the documented policy): calls with the same parent and the same full prompt are one call sent
  again (a client timeout, a lost reply). The gateway generates each and keeps them all as siblings; here only
  the one the harness continued is live: a member with a descendant, else (the harness went on with none of
  them: a retry of the session's last call) the latest one by ``seq``. Only acknowledged captures (status
  ``OK``) are members: a reply its caller never got can be neither live nor a parent. Every other member is a
  **dead branch**, never trained. When more than one member was continued, each continued one stays live (the
  harness did go on from each).
- **Witnesses**: "continued" is what the harness echoed: the gateway links a call to the earlier reply whose
  content (text, reasoning, tool calls) its history repeats, and, among siblings whose replies it repeats alike,
  to the one whose minted ids (tool-call ids, reply item ids: unique per capture) it echoed; such a link is
  *witnessed* (the child's admission cause ``echoed_ids``, ``polar.proxy.session.witness``). When a continued
  member's reply is the same token for token as another member's but the two differ in what would train (their
  logprobs), and no witnessed link names it, the echo cannot tell which one the harness really kept (the link
  chose one among equals): the shape is **ambiguous**, and every member of the group is masked with that reason
  rather than guessed. Identical replies whose logprobs agree within ``SAME_LOGPROB_TOLERANCE`` (the default
  tolerance of ``polar verify``: float noise, the rule on GPU engines) are no ambiguity: either is a faithful
  record of the same sample, so the continued one trains and the other is a dead branch.
- **Final retries**: a retry group no member of which was continued (the harness went on with none of them: a
  retry of the session's last call) has no witness in a later call. Copies sent back to back (no other call of
  the session between them: a hedge, a timeout's retry) that are one record (the same ids, logprobs within
  ``SAME_LOGPROB_TOLERANCE``) train once (the latest); back-to-back copies that differ are all masked
  ``ambiguous_witness``, never picked by ``seq`` (a copy its client did not read is no member:
  ``UNACKNOWLEDGED``). A copy sent again after other calls (a conversation re-sent after a compaction)
  supersedes the earlier ones: the latest is live.
- **Terminal**: the latest live, unpoisoned call by ``seq`` (of the main agent, when roles are known): the one the
  session ended on. The chain through it is the chain the harness kept (``terminal_path``); builders give shared
  prefixes to it.
- **Unfinished**: the session's last main call (by ``seq``, any status; a failed call counts as its parent's
  agent) has no clean answer: no member of its retry group is a live, unpoisoned OK call. It was poisoned,
  masked as ambiguous, failed, or never read by its client, and no retry answered it. The outcome reward was
  then earned by a session whose end is not on record: ``unfinished`` says why, and the training filter masks
  the whole rollout (``polar.trajectory.training_filter``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from db.enums import Admission, CaptureStatus
from polar.trajectory.records import CaptureRecord
from polar.trajectory.tree import CaptureTree, Link

# Two logprobs of one sampled token that differ by no more than this are one record (``polar verify`` passes them).
SAME_LOGPROB_TOLERANCE = 1e-5
ECHOED_IDS = "echoed_ids"  # a match's cause: its parent was singled out by the ids it echoed (the gateway's)
_GroupKey = tuple[int | None, int, tuple[int, ...]]  # a retry group: the parent, and the full prompt past it


class Untrained(StrEnum):
    """Why a sampled token is not trained (``merge_stats.untrained_tokens``)."""

    POISONED = "poisoned"  # on a chain from an unresolved call on
    DEAD_BRANCH = "dead_branch"  # a retry the harness did not continue
    UNACKNOWLEDGED = "unacknowledged"  # committed, but its caller never got it
    FAILED = "failed"  # not an OK capture for another reason (none sampled: kept for counts)
    AMBIGUOUS = "ambiguous_witness"  # a retry whose continued member the harness's echo cannot single out


class Unfinished(StrEnum):
    """Why the session's last main call has no clean answer (``Liveness.unfinished``; a ``filter_reason``)."""

    POISONED = "last_call_poisoned"
    AMBIGUOUS = "last_call_ambiguous"
    FAILED = "last_call_failed"
    UNACKNOWLEDGED = "last_call_unacknowledged"


@dataclass(frozen=True)
class Liveness:
    poisoned: frozenset[int]
    dead: frozenset[int]
    terminal: int | None
    terminal_path: frozenset[int]  # the terminal capture and its ancestors (through links)
    ambiguous: frozenset[int] = frozenset()  # retry members no witness singles out (module docstring)
    unfinished: Unfinished | None = None  # why the session's last main call has no clean answer

    def reason(self, capture_id: int) -> Untrained | None:
        if capture_id in self.poisoned:
            return Untrained.POISONED
        if capture_id in self.ambiguous:
            return Untrained.AMBIGUOUS
        if capture_id in self.dead:
            return Untrained.DEAD_BRANCH
        return None


def judge(tree: CaptureTree, main: Callable[[int], bool] | None = None) -> Liveness:
    """The liveness of every OK capture of ``tree`` (module docstring). ``main(capture_id)``: whether a call is
    the main agent's; the terminal call is then the latest live main call (a side call after the agent's last
    turn does not end its session), or the latest live call when there is none."""
    poisoned: set[int] = set()
    parent_of: dict[int, int | None] = {}
    groups: dict[_GroupKey, list[int]] = {}
    witnessed: set[int] = set()  # parents a child singled out by the ids it echoed
    links = {record.id: tree.link(record) for record in tree.records}
    keys = {capture_id: _group_key(link) for capture_id, link in links.items()}  # each call's retry group
    for record in tree.ok:  # seq order: parents before children
        link = links[record.id]
        parent = link.parent.id if link.parent is not None else None
        parent_of[record.id] = parent
        if parent is not None and record.admission_cause == ECHOED_IDS and not link.through_failed:
            witnessed.add(parent)
        if record.admission == Admission.UNRESOLVED.value or (parent is not None and parent in poisoned):
            poisoned.add(record.id)
        groups.setdefault(keys[record.id], []).append(record.id)
    continued = {parent for parent in parent_of.values() if parent is not None}
    seq = {record.id: record.seq for record in tree.ok}
    dead: set[int] = set()
    ambiguous: set[int] = set()
    for members in groups.values():
        if len(members) < 2:
            continue
        live = [m for m in members if m in continued]
        if not live:  # a final retry: no later call witnesses a member
            latest = max(members, key=seq.__getitem__)
            if _back_to_back(tree, members, keys) and not all(_same_record(tree, latest, o) for o in members):
                ambiguous.update(members)
            live = [latest]
        dead.update(m for m in members if m not in live)
        unwitnessed = [m for m in live if m in continued and m not in witnessed]
        if any(_twins(tree, m, other) for m in unwitnessed for other in members if other != m):
            ambiguous.update(members)
    candidates = [r for r in tree.ok if r.id not in poisoned and r.id not in dead and r.id not in ambiguous]
    mains = [r for r in candidates if main(r.id)] if main is not None else []
    terminal = (mains or candidates)[-1].id if candidates else None
    path: set[int] = set()
    node = terminal
    while node is not None:
        path.add(node)
        node = parent_of.get(node)
    liveness = Liveness(frozenset(poisoned), frozenset(dead), terminal, frozenset(path), frozenset(ambiguous))
    return dataclasses.replace(liveness, unfinished=_unfinished(tree, liveness, main, links, keys))


def _unfinished(
    tree: CaptureTree,
    liveness: Liveness,
    main: Callable[[int], bool] | None,
    links: dict[int, Link],
    keys: dict[int, _GroupKey],
) -> Unfinished | None:
    """Why the session's last main call has no clean answer, or None (module docstring)."""

    def is_main(record: CaptureRecord) -> bool:
        if main is None:
            return True
        if record.ok:
            return main(record.id)
        parent = links[record.id].parent
        return parent is None or main(parent.id)

    last = next((record for record in reversed(tree.records) if is_main(record)), None)
    if last is None or last.status is CaptureStatus.INTERRUPTED:
        return None
    group = [record for record in tree.records if keys[record.id] == keys[last.id]]
    if any(record.ok and liveness.reason(record.id) is None for record in group):
        return None
    reasons = {liveness.reason(record.id) for record in group if record.ok}
    if Untrained.POISONED in reasons:
        return Unfinished.POISONED
    if Untrained.AMBIGUOUS in reasons:
        return Unfinished.AMBIGUOUS
    return Unfinished.UNACKNOWLEDGED if last.status is CaptureStatus.UNACKNOWLEDGED else Unfinished.FAILED


def _group_key(link: Link) -> _GroupKey:
    """The retry group of a call, from its link: the same parent and the same full prompt."""
    return (link.parent.id if link.parent is not None else None, link.prefix_len, tuple(link.delta))


def _back_to_back(tree: CaptureTree, members: list[int], keys: dict[int, _GroupKey]) -> bool:
    """Whether the copies were sent with no other call of the session between them (a hedge, a timeout's
    retry). A copy sent again after the harness made other calls (Codex re-sends its conversation after a
    compaction) supersedes the earlier one: the harness read it, went on, and asked anew."""
    seqs = sorted(tree.by_id[m].seq for m in members)
    key = keys[members[0]]  # a failed copy of the same call between them is no other call
    return not any(seqs[0] < r.seq < seqs[-1] and keys[r.id] != key for r in tree.records)


def _same_record(tree: CaptureTree, a: int, b: int) -> bool:
    """Whether replies ``a`` and ``b`` are one record: the same ids, logprobs within ``SAME_LOGPROB_TOLERANCE``."""
    x, y = tree.by_id[a], tree.by_id[b]
    return x.output_ids == y.output_ids and not _twins(tree, a, b)


def _twins(tree: CaptureTree, a: int, b: int) -> bool:
    """Whether replies ``a`` and ``b`` are one echo (same ids) yet would train differently (logprobs further apart
    than ``SAME_LOGPROB_TOLERANCE``)."""
    x, y = tree.by_id[a], tree.by_id[b]
    if x.output_ids != y.output_ids:
        return False
    return any(abs(p - q) > SAME_LOGPROB_TOLERANCE for p, q in zip(x.output_logprobs, y.output_logprobs, strict=True))


def untrained_tokens(tree: CaptureTree, liveness: Liveness) -> dict[str, int]:
    """Sampled tokens no trace trains, by reason (``Untrained``)."""
    out: Counter[str] = Counter()
    for record in tree.ok:
        reason = liveness.reason(record.id)
        if reason is not None and record.output_ids:
            out[reason.value] += len(record.output_ids)
    for record in tree.records:
        if record.status is CaptureStatus.UNACKNOWLEDGED and record.output_ids:
            out[Untrained.UNACKNOWLEDGED.value] += len(record.output_ids)
    return dict(sorted(out.items()))


def root_causes(tree: CaptureTree) -> dict[str, int]:
    """OK roots and unresolved calls by the cause the gateway recorded (the first call's ``first_call``
    excluded: only the roots that need a reason; a match's ``echoed_ids`` is no root)."""
    out: Counter[str] = Counter()
    for record in tree.ok:
        cause = record.admission_cause
        if cause is not None and cause != "first_call" and record.admission != Admission.MATCH.value:
            out[cause] += 1
    return dict(sorted(out.items()))
