"""Compaction recognised by what it is: a call that asks for a summary, and a later root that starts from it.

A harness does not carry a summary into the next conversation verbatim. Claude Code 2.1.332 drops the
``<analysis>`` block, turns ``<summary>...</summary>`` into ``Summary:`` and may squeeze blank lines; others wrap it
in their own words. So a reply is matched by its *body*: the analysis block dropped, the summary tags removed,
whitespace normalised; found whole in a root's user or assistant text, or in part (its lines of
``MIN_MATCH``+ characters that are found cover at least half of the body: a harness that cuts or escapes a line
still carries the rest). A harness's own markers (``RoleHints``) say the same without the body: a marker in a
call's system prompt or last user message makes it a compaction call, a continuation marker in a root's user
text makes it a post-compaction root (linked to the latest compaction call before it).

Without hints, the request must ask for a summary (``_SUMMARISE``). A call offering no tools may ask in its
system prompt or last user message, and its summary may come back in a user or an assistant turn (OpenCode puts
it in an assistant turn). A call offering tools (Claude Code forks its compaction from the main conversation:
the same system prompt, every tool) must ask in its last user message, one its parent call did not have (a main
agent's system prompt, task or carried summary may mention summaries on every turn), reply with text and no tool
call, and its summary must come back in a *user* turn: a harness that rebuilds its history from the model's
replies every turn (aider) carries them as assistant turns, and no one asked for a summary.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from harness_adapters.base import RoleHints
from polar.trajectory.records import CaptureRecord
from polar.trajectory.tree import CaptureTree

MIN_MATCH = 16  # shorter texts ("Done.", "ok") are too common to prove a link
_SUMMARISE = re.compile(r"\bsummar\w*|\bcompact\w*|\bcondens\w*|\bdistill?\w*", re.IGNORECASE)
_ANALYSIS = re.compile(r"<analysis>.*?</analysis>", re.IGNORECASE | re.DOTALL)
_SUMMARY_TAG = re.compile(r"</?summary>", re.IGNORECASE)


class CallView(Protocol):
    """What this module reads of a call (``polar.trajectory.roles.CallView``, which imports this module)."""

    @property
    def system(self) -> str: ...
    @property
    def user_texts(self) -> tuple[str, ...]: ...
    @property
    def assistant_texts(self) -> tuple[str, ...]: ...
    @property
    def tools(self) -> tuple[str, ...]: ...
    @property
    def reply_text(self) -> str: ...
    @property
    def reply_tool_calls(self) -> tuple[tuple[str, Any], ...]: ...
    @property
    def last_user(self) -> str: ...


def normalised(text: str) -> str:
    """``text`` with every run of whitespace one space, stripped."""
    return " ".join(text.split())


def summary_lines(reply: str) -> list[str]:
    """The lines of a reply's summary, normalised: the analysis block dropped and the summary tags removed."""
    body = _SUMMARY_TAG.sub("\n", _ANALYSIS.sub("\n", reply))
    return [line for line in (normalised(raw) for raw in body.splitlines()) if line]


def summary_body(reply: str) -> str:
    """What a harness carries of a summary reply (see the module docstring), whitespace normalised."""
    return " ".join(summary_lines(reply))


def carries(texts: Sequence[str], reply: str) -> bool:
    """Whether ``texts`` (normalised with ``normalised``) carry the summary in ``reply``: its body whole, or lines
    of it covering at least half of the body."""
    body = summary_body(reply)
    if len(body) < MIN_MATCH or not texts:
        return False
    if any(body in text for text in texts):
        return True
    found = sum(len(line) for line in set(summary_lines(reply)) if len(line) >= MIN_MATCH and _in(texts, line))
    return 2 * found >= len(body)


def _in(texts: Iterable[str], needle: str) -> bool:
    return any(needle in text for text in texts)


def hinted_compaction(view: CallView, hints: RoleHints) -> bool:
    return any(m in view.system or m in view.last_user for m in hints.compaction_markers)


def asks_summary(view: CallView, parent: CallView | None = None) -> bool:
    """Whether a call's request asks for a summary, read by structure alone (see the module docstring). A call
    offering tools asks in a user message its parent call (``parent``) did not have: a main agent whose task or
    carried summary mentions summaries does not ask again on every turn."""
    if not view.tools:
        return bool(_SUMMARISE.search(view.last_user) or _SUMMARISE.search(view.system))
    new = parent is None or view.last_user not in parent.user_texts
    return new and bool(_SUMMARISE.search(view.last_user)) and not view.reply_tool_calls


def summaries(
    tree: CaptureTree, view: Callable[[CaptureRecord], CallView], hinted: set[int], hints: RoleHints
) -> dict[int, int]:
    """Post-compaction root -> its compaction call: the latest earlier OK call that asked for a summary (hinted or
    by structure) and whose summary the root carries; else, for a root holding a hinted continuation marker, the
    latest earlier OK call that asked for one."""
    asked = {
        r.id
        for r in tree.ok
        if r.id in hinted or asks_summary(view(r), view(tree.by_id[r.parent_id]) if r.parent_id is not None else None)
    }
    summary_of: dict[int, int] = {}
    for root in (r for r in tree.records if r.parent_id is None):
        v = view(root)
        users = [normalised(t) for t in v.user_texts]
        both = [*users, *(normalised(t) for t in v.assistant_texts)]
        earlier = [r for r in reversed(tree.ok) if r.seq < root.seq and r.id in asked]
        for call in earlier:
            offered_tools = bool(view(call).tools) and call.id not in hinted
            if carries(users if offered_tools else both, view(call).reply_text):
                summary_of[root.id] = call.id
                break
        else:
            if earlier and any(m in t for m in hints.continuation_markers for t in v.user_texts):
                summary_of[root.id] = earlier[0].id
    return summary_of
