"""Roles of a session's chains: which root is the main agent, a sub-agent, a compaction, a title, or other, and
the call each came from (issue 16).

Labels come from the structure of the calls, read off ``CallView``s (what each call sent and what it got back),
plus per-harness ``RoleHints`` that adapters declare as data. The rules, in ``seq`` order:

- **compaction call**: a call that *asks* for a summary (a hinted compaction marker in its system prompt or last
  user message, or its request asking to summarise) and whose summary a later root carries, recognised by its
  body rather than verbatim (``polar.trajectory.summaries``: the analysis block and summary tags dropped,
  whitespace normalised, whole or in large part), or that a root with a hinted continuation marker follows; a
  hinted call is one even without that. Claude Code's compaction call offers every tool and forks from the main
  conversation; it is one too (asking in a new last user message, replying with text only, its summary carried
  in a user turn). A history rewrite alone is not a compaction: a harness that rebuilds its history from the
  model's replies every turn (aider) carries each reply into the next root without anyone asking for a summary.
  It is cut from the chain it extends (``BreakCause.COMPACTION``) and links to the chain it summarised: its
  parent in the capture tree, else the latest earlier call of a main or sub-agent chain.
- **post-compaction root**: a root carrying such a summary; it keeps the role of the chain that was summarised
  (``main`` or ``sub_agent``), links to the compaction call and is marked ``compacted``. This is decided before
  the sub-agent rule: a summary quotes the tool-call arguments of the work it summarises.
- **sub-agent root**: a root whose first user messages hold a string argument of a tool call an earlier call
  sampled (a hinted launcher tool's prompt argument, or any string argument of 16+ characters); it links to
  that call (the latest such).
- **title**: a root whose system prompt holds a hinted title marker.
- **main**: the first other root that offers tools (or the first root at all, when none does), any root that
  continues it under rewritten history (same system prompt and tools, *or* the same opening user message: one
  agent that added a tool, changed its system prompt or echoed other reasoning is still the same agent, on the
  same task; an opening shorter than 16 characters counts only with the same system prompt or the same tools,
  since alone it is too common to prove the task), and any root nothing is known about (no view: structure
  alone cannot tell it apart); every other root is ``other``.

Every non-start capture has the role of the chain start above it in the tree (failed calls included), so a
chain's role is the role of its first capture's start. The labeller is pure: it never reads the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from harness_adapters.base import RoleHints as RoleHints  # re-exported: builders' callers name it from here
from polar.trajectory.records import CaptureRecord
from polar.trajectory.summaries import MIN_MATCH, hinted_compaction, summaries
from polar.trajectory.tree import CaptureTree


class Role(StrEnum):
    MAIN = "main"
    SUB_AGENT = "sub_agent"
    COMPACTION = "compaction"
    TITLE = "title"
    OTHER = "other"


@dataclass(frozen=True)
class CallView:
    """What labelling reads of one call: its system text, user and assistant message texts in order, the tools
    it offered, and the reply it got (text and tool calls with parsed arguments)."""

    capture_id: int
    system: str = ""
    user_texts: tuple[str, ...] = ()
    assistant_texts: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    reply_text: str = ""
    reply_tool_calls: tuple[tuple[str, Any], ...] = ()

    @property
    def last_user(self) -> str:
        return self.user_texts[-1] if self.user_texts else ""


@dataclass(frozen=True)
class ChainLabel:
    """The label of a chain start: its role, the call it came from, and whether it starts from a summary."""

    capture_id: int
    role: Role
    link_id: int | None = None
    compacted: bool = False


@dataclass(frozen=True)
class SessionRoles:
    """Labels of a session: one per chain start (roots and compaction calls), and each capture's start."""

    starts: Mapping[int, ChainLabel]
    start_of: Mapping[int, int]  # capture id -> the id of the chain start above it (itself for a start)

    @property
    def compaction_calls(self) -> frozenset[int]:
        return frozenset(i for i, label in self.starts.items() if label.role is Role.COMPACTION)

    def label_of(self, capture_id: int) -> ChainLabel:
        return self.starts[self.start_of[capture_id]]

    def counts(self) -> dict[str, int]:
        """Chain starts by role, for the merge statistics."""
        out: dict[str, int] = {}
        for label in self.starts.values():
            out[label.role.value] = out.get(label.role.value, 0) + 1
        return dict(sorted(out.items()))


def _holds(texts: Iterable[str], needle: str) -> bool:
    needle = needle.strip()
    return len(needle) >= MIN_MATCH and any(needle in text for text in texts)


def _string_args(arguments: Any) -> list[str]:
    if isinstance(arguments, Mapping):
        return [value for value in arguments.values() if isinstance(value, str)]
    return []


def label_session(
    records: Iterable[CaptureRecord] | CaptureTree,
    views: Mapping[int, CallView] | None = None,
    hints: RoleHints | None = None,
) -> SessionRoles:
    """Label every chain start of one session (see the module docstring). Captures without a view are judged
    by tree shape alone: the first root is ``main``, later ones ``other``."""
    tree = records if isinstance(records, CaptureTree) else CaptureTree(records)
    views = views or {}
    hints = hints or RoleHints()
    empty = CallView(0)

    def view(record: CaptureRecord) -> CallView:
        return views.get(record.id, empty)

    hinted = {r.id for r in tree.records if hinted_compaction(view(r), hints)}
    summary_of = summaries(tree, view, hinted, hints)
    starts, start_of = _label_starts(tree, views, hints, hinted | set(summary_of.values()), summary_of)
    if not any(label.role is Role.MAIN for label in starts.values()):
        _first_other_is_main(starts, views)
    return SessionRoles(starts, start_of)


def _label_starts(
    tree: CaptureTree,
    views: Mapping[int, CallView],
    hints: RoleHints,
    compactions: set[int],
    summary_of: Mapping[int, int],
) -> tuple[dict[int, ChainLabel], dict[int, int]]:
    """Each chain start's label in call order, and the chain start of every call."""
    empty = CallView(0)
    starts: dict[int, ChainLabel] = {}
    start_of: dict[int, int] = {}
    main_key: tuple[str, tuple[str, ...]] | None = None
    main_opening: str | None = None  # the main agent's first user message: its task, which a re-rooted call repeats
    for record in tree.records:
        v = views.get(record.id, empty)
        parent_id = record.parent_id
        if record.id in compactions:
            link = parent_id if parent_id is not None else _latest_agent_call(tree, record, starts, start_of)
            starts[record.id] = ChainLabel(record.id, Role.COMPACTION, link)
        elif parent_id is not None:
            start_of[record.id] = start_of[parent_id]
            continue
        elif record.id in summary_of:
            source = summary_of[record.id]
            summarised = starts[start_of[source]].link_id if source in start_of else None
            role = Role.MAIN
            if summarised is not None and summarised in start_of:
                role = starts[start_of[summarised]].role
                role = role if role in (Role.MAIN, Role.SUB_AGENT) else Role.MAIN
            starts[record.id] = ChainLabel(record.id, role, source, compacted=True)
        elif (launcher := _launcher(tree, record, v, views, hints)) is not None:
            starts[record.id] = ChainLabel(record.id, Role.SUB_AGENT, launcher)
        elif any(m in v.system for m in hints.title_markers):
            starts[record.id] = ChainLabel(record.id, Role.TITLE)
        elif _blank(v) or (main_key is None and v.tools) or _same_agent(v, main_key, main_opening):
            main_key = main_key or (None if _blank(v) else (v.system, v.tools))
            if main_opening is None and not _blank(v):
                main_opening = v.user_texts[0] if v.user_texts else ""
            starts[record.id] = ChainLabel(record.id, Role.MAIN)
        else:
            starts[record.id] = ChainLabel(record.id, Role.OTHER)
        start_of[record.id] = record.id
    return starts, start_of


def _same_agent(view: CallView, main_key: tuple[str, tuple[str, ...]] | None, main_opening: str | None) -> bool:
    """Whether a root continues the main agent: the same system prompt and tools, or the same opening user message
    (one shorter than ``MIN_MATCH`` only with the same system prompt or the same tools)."""
    if main_key is None:
        return False
    if (view.system, view.tools) == main_key:
        return True
    if not main_opening or view.user_texts[:1] != (main_opening,):
        return False
    return len(main_opening) >= MIN_MATCH or view.system == main_key[0] or view.tools == main_key[1]


def _first_other_is_main(starts: dict[int, ChainLabel], views: Mapping[int, CallView]) -> None:
    """No root offered tools (a text-mode harness): the first other root is the main agent, and so is every
    other root of that agent (same system prompt, or same opening task), e.g. aider's rebuilt histories."""
    empty = CallView(0)
    first = next((label for label in starts.values() if label.role is Role.OTHER), None)
    if first is None:
        return
    lead = views.get(first.capture_id, empty)
    for label in list(starts.values()):
        other = views.get(label.capture_id, empty)
        same = other.system == lead.system or (
            bool(lead.user_texts)
            and len(lead.user_texts[0]) >= MIN_MATCH
            and other.user_texts[:1] == lead.user_texts[:1]
        )
        if label is first or (label.role is Role.OTHER and same):
            starts[label.capture_id] = ChainLabel(label.capture_id, Role.MAIN, label.link_id, label.compacted)


def _blank(view: CallView) -> bool:
    return not (view.system or view.user_texts or view.assistant_texts or view.tools)


def _latest_agent_call(
    tree: CaptureTree, record: CaptureRecord, starts: Mapping[int, ChainLabel], start_of: Mapping[int, int]
) -> int | None:
    """The latest earlier OK call of a main or sub-agent chain: what a root compaction call summarised."""
    for earlier in reversed([r for r in tree.ok if r.seq < record.seq and r.id in start_of]):
        if starts[start_of[earlier.id]].role in (Role.MAIN, Role.SUB_AGENT):
            return earlier.id
    return None


def _launcher(
    tree: CaptureTree, root: CaptureRecord, view: CallView, views: Mapping[int, CallView], hints: RoleHints
) -> int | None:
    """The latest earlier call whose sampled tool call handed this root its first user message."""
    opening = view.user_texts[:2]
    if not opening:
        return None
    for earlier in reversed([r for r in tree.ok if r.seq < root.seq]):
        for name, arguments in views.get(earlier.id, CallView(0)).reply_tool_calls:
            hinted = hints.sub_agent_tools.get(name)
            if hinted is not None and isinstance(arguments, Mapping):
                prompt = arguments.get(hinted)
                if isinstance(prompt, str) and prompt.strip() and any(prompt.strip() in t for t in opening):
                    return earlier.id
            elif any(_holds(opening, value) for value in _string_args(arguments)):
                return earlier.id
    return None
