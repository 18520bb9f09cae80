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
  rather than guessed. Identical replies with identical logprobs are no ambiguity (whichever was kept trains the
  same tokens with the same weights).
- **Terminal**: the latest live, unpoisoned call by ``seq`` (of the main agent, when roles are known): the one the
  session ended on. The chain through it
  is the chain the harness kept (``terminal_path``); builders give shared prefixes to it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from db.enums import Admission, CaptureStatus
from polar.trajectory.tree import CaptureTree

ECHOED_IDS = "echoed_ids"  # a match's cause: its parent was singled out by the ids it echoed (the gateway's)


class Untrained(StrEnum):
    """Why a sampled token is not trained (``merge_stats.untrained_tokens``)."""

    POISONED = "poisoned"  # on a chain from an unresolved call on
    DEAD_BRANCH = "dead_branch"  # a retry the harness did not continue
    UNACKNOWLEDGED = "unacknowledged"  # committed, but its caller never got it
    FAILED = "failed"  # not an OK capture for another reason (none sampled: kept for counts)
    AMBIGUOUS = "ambiguous_witness"  # a retry whose continued member the harness's echo cannot single out


@dataclass(frozen=True)
class Liveness:
    poisoned: frozenset[int]
    dead: frozenset[int]
    terminal: int | None
    terminal_path: frozenset[int]  # the terminal capture and its ancestors (through links)
    ambiguous: frozenset[int] = frozenset()  # retry members no witness singles out (module docstring)

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
    groups: dict[tuple[int | None, int, tuple[int, ...]], list[int]] = {}
    witnessed: set[int] = set()  # parents a child singled out by the ids it echoed
    for record in tree.ok:  # seq order: parents before children
        link = tree.link(record)
        parent = link.parent.id if link.parent is not None else None
        parent_of[record.id] = parent
        if parent is not None and record.admission_cause == ECHOED_IDS and not link.through_failed:
            witnessed.add(parent)
        if record.admission == Admission.UNRESOLVED.value or (parent is not None and parent in poisoned):
            poisoned.add(record.id)
        groups.setdefault((parent, link.prefix_len, tuple(link.delta)), []).append(record.id)
    continued = {parent for parent in parent_of.values() if parent is not None}
    seq = {record.id: record.seq for record in tree.ok}
    dead: set[int] = set()
    ambiguous: set[int] = set()
    for members in groups.values():
        if len(members) < 2:
            continue
        live = [m for m in members if m in continued] or [max(members, key=seq.__getitem__)]
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
    return Liveness(frozenset(poisoned), frozenset(dead), terminal, frozenset(path), frozenset(ambiguous))


def _twins(tree: CaptureTree, a: int, b: int) -> bool:
    """Whether replies ``a`` and ``b`` are one echo (same ids) yet would train differently (other logprobs)."""
    x, y = tree.by_id[a], tree.by_id[b]
    return x.output_ids == y.output_ids and x.output_logprobs != y.output_logprobs


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
