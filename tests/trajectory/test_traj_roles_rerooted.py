"""Roles that don't hide real turns: one agent re-rooted (a tool added, other reasoning echoed, its history rebuilt
every turn as aider does) stays the main agent and trains; a compaction is a call that asks for a summary."""

from __future__ import annotations

from traj_helpers import EOT, RecordTree

from polar.trajectory.choices import select_roles
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.roles import CallView, Role, label_session

TASK = "Fix the failing test in tests/test_parser.py please"
SYSTEM = "You are a coding agent."


def _roots(n: int) -> RecordTree:
    tree = RecordTree()
    for i in range(n):
        tree.add([1, 50 + i, EOT, 1, 60], [10 + i, EOT])
    return tree


def test_a_tool_added_mid_session_keeps_the_main_role() -> None:
    tree = _roots(2)
    views = {
        1: CallView(1, SYSTEM, (TASK,), (), ("bash",), "Running the tests now, one moment"),
        2: CallView(2, SYSTEM, (TASK, "ok"), ("Running the tests now, one moment",), ("bash", "edit"), "Done"),
    }
    roles = label_session(tree.records, views)
    assert [roles.label_of(i).role for i in (1, 2)] == [Role.MAIN, Role.MAIN]


def test_a_changed_system_prompt_or_reasoning_keeps_the_main_role() -> None:
    tree = _roots(2)
    views = {
        1: CallView(1, SYSTEM, (TASK,), (), ("bash",), "Looking"),
        2: CallView(2, SYSTEM + " Today is Monday.", (TASK,), (), ("bash",), "Looking again"),
    }
    roles = label_session(tree.records, views)
    assert roles.label_of(2).role is Role.MAIN


def test_an_aider_style_full_history_rebuild_is_main_not_compaction() -> None:
    """Text mode, no tools; each turn a new root whose history carries the earlier replies as assistant turns."""
    replies = ["Here is the patch for parser.py: ...", "I also updated the test file: ...", "All tests pass now."]
    tree = _roots(3)
    views = {
        i + 1: CallView(i + 1, SYSTEM, (TASK, *(["next"] * i)), tuple(replies[:i]), (), replies[i]) for i in range(3)
    }
    roles = label_session(tree.records, views)
    assert [roles.label_of(i).role for i in (1, 2, 3)] == [Role.MAIN] * 3
    assert not roles.compaction_calls
    # One trainable sample per call, each reply trained once under the default role filter.
    traces = select_roles(prefix_merge(tree.records, roles=roles).traces, [Role.MAIN, Role.SUB_AGENT])
    assert [t.role for t in traces] == ["main"] * 3
    assert [t.n_loss_tokens for t in traces] == [2, 2, 2]


def test_a_call_that_asks_for_a_summary_is_a_compaction() -> None:
    summary = "The user asked to fix the parser; the patch is applied and tests pass."
    tree = _roots(3)
    views = {
        1: CallView(1, SYSTEM, (TASK,), (), ("bash",), "Working on it now"),
        2: CallView(2, "", (TASK, "Summarize the conversation so far."), ("Working on it now",), (), summary),
        3: CallView(3, SYSTEM, (summary,), (), ("bash",), "Continuing"),
    }
    roles = label_session(tree.records, views)
    assert roles.label_of(2).role is Role.COMPACTION
    assert roles.label_of(3).role is Role.MAIN and roles.label_of(3).compacted
