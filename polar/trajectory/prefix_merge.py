"""The ``prefix_merge`` builder: one trace per root-to-leaf chain of the capture tree.

A chain r -> c2 -> ... -> cK gives ``prompt = full_prompt(r)`` and ``response = a1 ‖ u1 ‖ a2 ‖ ... ‖ aK``: a_k
are the ids sampled by call k (loss 1, real logprobs), u_k the tokens inserted before call k+1 (tool results,
new user turns, template glue such as the end-of-turn added after a truncated reply; loss 0, placeholder
logprobs). Whether child c (shared prefix ``k = c.prefix_len`` with its parent p, whose prompt has L tokens and
whose sequence prompt+output has S) merges into p's chain:

- ``k == S``: the child conditions on exactly what p sampled (always so in append mode); u = c's delta.
  The merge is *conditioning-exact*.
- ``L <= k < S``: the child's prompt extends p's prompt, but holds a re-rendering of the reply instead of the
  sampled ids (canonical mode; tokenisation drift, re-serialised tool calls). The merge is kept, as the anchor
  does, and counted *conditioning-inexact*: the trained tokens are exactly what was sampled, but later turns
  conditioned on the re-rendering, not on them. The re-rendered copy is skipped: u starts at the first
  end-of-turn id in c's delta (the re-rendered turn's close, which the model did not sample when p was
  truncated) or just after it (when p's own output already ends with that id). So the merged sequence is
  c's prompt with the reply's re-rendering replaced by the sampled ids.
- ``k < L``: the harness rewrote history (compaction in place, edited messages, volatile headers): the chain
  breaks (``prompt_rewritten``) and c starts a new chain with its own full prompt.

Inexact merges need the end-of-turn id: pass ``end_of_turn_id`` or it is read off the rollout's own captures;
where it is unknown or absent from the delta the chain breaks instead of guessing. Failed captures carry no
reply: they are left out and counted, and their children link through them (``CaptureTree.link``).

Compaction calls (``polar.trajectory.roles``) never merge into the chain they summarise: they start a chain of
their own (``compaction``), so the summary is trained, if at all, on the prompt it was sampled from, and the
post-compaction root starts a new chain from the summary it was given. Each trace carries the role and link of
its chain start.

Branches (parallel calls, retries of one prompt) give one chain each; every child after a call's first is
counted as a ``branch`` split, so ``traces_out == roots + breaks``. Chains are numbered depth first, children
by ``seq``. Every live sampled token is trained in exactly one trace: a call on the path to the session's
terminal call (the chain the harness kept, ``polar.trajectory.liveness``) in the first chain through the
terminal call, so shared prefixes are owned by the kept chain; any other call in the first chain that reaches
it. Sibling chains carry them as masked context with their real logprobs. Poisoned calls and dead retries stay
in their chains with mask 0, counted in ``untrained_tokens``.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from polar.trajectory.liveness import Liveness, judge, root_causes, untrained_tokens
from polar.trajectory.records import (
    PLACEHOLDER_LOGPROB,
    BuildResult,
    CaptureRecord,
    MergeStats,
    Trace,
    VersionRange,
    merged_spans,
    version_bounds,
)
from polar.trajectory.roles import Role, SessionRoles, label_session
from polar.trajectory.sampling import SamplingRange, merged_sampling
from polar.trajectory.tree import CaptureTree, Link

NAME = "prefix_merge"
_STOP = "stop"
_LENGTH = "length"


class BreakCause(StrEnum):
    """Why a capture with a parent started a chain of its own."""

    PROMPT_REWRITTEN = "prompt_rewritten"  # its prompt does not extend the parent's prompt
    REPLY_NOT_FOUND = "reply_not_found"  # re-rendered reply, but no end-of-turn id after it in the new tokens
    NO_END_OF_TURN_ID = "no_end_of_turn_id"  # re-rendered reply, and the end-of-turn id is unknown
    PARENT_FAILED = "parent_failed"  # every ancestor is a failed call: nothing to merge into
    COMPACTION = "compaction"  # a compaction call: cut from the chain it summarises (polar.trajectory.roles)
    BRANCH = "branch"  # a second or later child of one call: it merges, but the chain splits there
    PER_REQUEST = "per_request"  # per_request cuts every non-root call from its parent by design


@dataclass(frozen=True)
class _Edge:
    """``child`` continues its parent's chain after the ``inserted`` tokens."""

    parent_id: int | None
    child: CaptureRecord
    inserted: Sequence[int]
    exact: bool


def prefix_merge(
    captures: Iterable[CaptureRecord], /, *, roles: SessionRoles | None = None, end_of_turn_id: int | None = None
) -> BuildResult:
    """Merged traces of one rollout's captures (see the module docstring for the rules)."""
    tree = CaptureTree(captures)
    roles = roles if roles is not None else label_session(tree)
    compactions = roles.compaction_calls
    # Detection scans the rollout; append-mode sessions never need it, so it runs on first use only.
    end_of_turn = functools.cache(lambda: end_of_turn_id if end_of_turn_id is not None else detect_end_of_turn(tree))
    children: dict[int | None, list[_Edge]] = {}
    chain_roots: list[CaptureRecord] = []
    causes: Counter[str] = Counter()
    roots = exact = inexact = 0
    for record in tree.ok:  # seq order, so children lists come out sorted by seq
        link = tree.link(record)
        cut = record.id in compactions and link.parent is not None
        decision = BreakCause.COMPACTION if cut else _decide(tree, record, link, end_of_turn)
        if isinstance(decision, _Edge):
            siblings = children.setdefault(decision.parent_id, [])
            if siblings:
                causes[BreakCause.BRANCH.value] += 1
            siblings.append(decision)
            exact += decision.exact
            inexact += not decision.exact
            continue
        chain_roots.append(record)
        if decision is None:
            roots += 1
        else:
            causes[decision.value] += 1
    liveness = judge(tree, lambda capture_id: roles.label_of(capture_id).role is Role.MAIN)
    traces = _walk(tree, chain_roots, children, roles, liveness)
    ok = tree.ok
    stats = MergeStats(
        builder=NAME,
        captures_in=len(tree.records),
        error_captures=len(tree.records) - len(ok),
        traces_out=len(traces),
        roots=roots,
        exact_merges=exact,
        inexact_merges=inexact,
        break_causes=dict(sorted(causes.items())),
        sampled_tokens=sum(len(record.output_ids) for record in ok),
        loss_tokens=sum(trace.n_loss_tokens for trace in traces),
        roots_by_role=roles.counts(),
        untrained_tokens=untrained_tokens(tree, liveness),
        root_causes=root_causes(tree),
        unfinished=liveness.unfinished,
    )
    return BuildResult(NAME, tuple(traces), stats)


def link_kinds(captures: Iterable[CaptureRecord], /, *, end_of_turn_id: int | None = None) -> dict[int, str]:
    """How each capture entered the merged chains, by capture id: ``root`` (a chain of its own with no parent),
    ``exact`` or ``inexact`` (merged into its parent's chain), a ``BreakCause`` value (had a parent but started a
    chain), or ``failed`` (an ERROR capture, left out). The same decisions ``prefix_merge`` makes."""
    tree = CaptureTree(captures)
    end_of_turn = functools.cache(lambda: end_of_turn_id if end_of_turn_id is not None else detect_end_of_turn(tree))
    kinds = {record.id: "failed" for record in tree.records if not record.ok}
    for record in tree.ok:
        decision = _decide(tree, record, tree.link(record), end_of_turn)
        if isinstance(decision, _Edge):
            kinds[record.id] = "exact" if decision.exact else "inexact"
        else:
            kinds[record.id] = "root" if decision is None else decision.value
    return kinds


def detect_end_of_turn(tree: CaptureTree) -> int | None:
    """The model's end-of-turn id, read off the captures: the commonest last id of replies that stopped,
    else the commonest first inserted id after truncated replies (append mode glues the end-of-turn there)."""
    closing = Counter(r.output_ids[-1] for r in tree.ok if r.finish_reason == _STOP and r.output_ids)
    if not closing:
        for record in tree.ok:
            link = tree.link(record)
            parent = link.parent
            if (
                parent is not None
                and parent.finish_reason == _LENGTH
                and link.prefix_len == tree.sequence_len(parent)
                and link.delta
            ):
                closing[link.delta[0]] += 1
    if not closing:
        return None
    # Ties go to the smallest id, so the answer never depends on capture order.
    return min(closing.items(), key=lambda item: (-item[1], item[0]))[0]


def _decide(
    tree: CaptureTree, record: CaptureRecord, link: Link, end_of_turn: Callable[[], int | None]
) -> _Edge | BreakCause | None:
    """An edge into the parent's chain, the cause of a break, or ``None`` for a plain root."""
    parent = link.parent
    if parent is None:
        return BreakCause.PARENT_FAILED if link.through_failed else None
    shared = link.prefix_len
    if shared == tree.sequence_len(parent):
        return _Edge(parent.id, record, link.delta, exact=True)
    if shared < tree.prompt_len(parent):
        return BreakCause.PROMPT_REWRITTEN
    eot = end_of_turn()
    if eot is None:
        return BreakCause.NO_END_OF_TURN_ID
    try:
        close = list(link.delta).index(eot)
    except ValueError:
        return BreakCause.REPLY_NOT_FOUND
    # A reply that ended with its own end-of-turn keeps it as a sampled token; the copy's close is dropped.
    start = close + 1 if parent.output_ids[-1:] == (eot,) else close
    return _Edge(parent.id, record, link.delta[start:], exact=False)


@dataclass(frozen=True)
class _Mark:
    """Buffer lengths before a node of the current path was appended (to backtrack to), where its sampled ids
    start, and the path's running counts up to and including that node."""

    ids: int
    spans: int
    out: int
    inexact: int
    malformed: int


def _kept_chain(children: dict[int | None, list[_Edge]], terminal: int | None) -> frozenset[int]:
    """The terminal call and the calls it merged into, up to its chain's start: the chain the harness kept."""
    merged_into = {edge.child.id: parent for parent, edges in children.items() for edge in edges}
    kept: set[int] = set()
    node = terminal
    while node is not None:
        kept.add(node)
        node = merged_into.get(node)
    return frozenset(kept)


def _walk(
    tree: CaptureTree,
    chain_roots: list[CaptureRecord],
    children: dict[int | None, list[_Edge]],
    roles: SessionRoles,
    liveness: Liveness,
) -> list[Trace]:
    """Depth-first over each chain root, children by seq; one trace per leaf.

    One set of buffers is shared by all chains of a root: descending appends a node's tokens, backtracking
    truncates them, so each chain costs its own tokens once rather than a rebuild from the root per turn. The
    mask is set per trace: a live call trains in the first trace that reaches it, except that a call of the kept
    chain trains only in the first trace through the terminal call.
    """
    kept = _kept_chain(children, liveness.terminal)
    owned: set[int] = set()
    kept_found = False  # the first trace through the terminal call is the kept one
    traces: list[Trace] = []
    for root in chain_roots:
        prompt = tree.full_prompt(root)
        label = roles.label_of(root.id)
        ids: list[int] = []
        logprobs: list[float] = []
        spans: list[VersionRange] = []
        path: list[CaptureRecord] = []
        marks: list[_Mark] = []
        stack: list[tuple[_Edge, int]] = [(_Edge(None, root, (), exact=True), 0)]
        while stack:
            edge, depth = stack.pop()
            if depth < len(marks):  # backtrack to this node's parent
                mark = marks[depth]
                del ids[mark.ids :], logprobs[mark.ids :], spans[mark.spans :]
                del path[depth:], marks[depth:]
            node = edge.child
            before = marks[-1] if marks else _Mark(0, 0, 0, 0, 0)
            start = len(ids)
            ids.extend(edge.inserted)
            logprobs.extend([PLACEHOLDER_LOGPROB] * len(edge.inserted))
            offset = len(ids)
            marks.append(
                _Mark(
                    start,
                    len(spans),
                    offset,
                    before.inexact + (not edge.exact),
                    before.malformed + node.n_malformed_tool_calls,
                )
            )
            ids.extend(node.output_ids)
            logprobs.extend(node.output_logprobs)
            spans.extend(VersionRange(s.version, s.start + offset, s.end + offset) for s in node.sampled_versions())
            path.append(node)
            below = children.get(node.id)
            if below:
                stack.extend((child, depth + 1) for child in reversed(below))
                continue
            merged = merged_spans(spans)
            low, high = version_bounds(merged)
            through_terminal = not kept_found and any(n.id == liveness.terminal for n in path)
            kept_found |= through_terminal
            traces.append(
                Trace(
                    chain_index=len(traces),
                    capture_ids=tuple(n.id for n in path),
                    prompt_ids=prompt,
                    response_ids=tuple(ids),
                    loss_mask=_mask(len(ids), path, marks, kept, owned, liveness),
                    response_logprobs=tuple(logprobs),
                    version_spans=merged,
                    sampling_spans=_path_sampling(path, marks),
                    weight_version_min=low,
                    weight_version_max=high,
                    finish_reason=node.finish_reason,
                    n_inexact_merges=marks[-1].inexact,
                    n_malformed_tool_calls=marks[-1].malformed,
                    role=label.role.value,
                    source_capture_id=label.link_id,
                    compacted=label.compacted,
                    kept=through_terminal,
                )
            )
    return traces


def _path_sampling(path: list[CaptureRecord], marks: list[_Mark]) -> tuple[SamplingRange, ...]:
    """The sampling spans of the trace along ``path``: each call's, at its sampled ids' response positions."""
    pairs = zip(path, marks, strict=True)
    return merged_sampling([span.shifted(mark.out) for node, mark in pairs for span in node.sampling_spans])


def _mask(
    n: int, path: list[CaptureRecord], marks: list[_Mark], kept: frozenset[int], owned: set[int], liveness: Liveness
) -> tuple[int, ...]:
    """The loss mask of the trace along ``path``: 1 on the sampled ids of each live call it is the first to own
    (``owned`` is updated), 0 elsewhere."""
    mask = [0] * n
    through_terminal = any(node.id == liveness.terminal for node in path)
    for node, mark in zip(path, marks, strict=True):
        if node.id in owned or liveness.reason(node.id) is not None or (node.id in kept and not through_terminal):
            continue
        owned.add(node.id)
        mask[mark.out : mark.out + len(node.output_ids)] = [1] * len(node.output_ids)
    return tuple(mask)
