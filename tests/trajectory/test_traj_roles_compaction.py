"""Compaction recognised by what it is (issue 52), over Claude-Code-shaped sessions, with and without hints.

Claude Code 2.1.332 forks its compaction call from the main conversation: the same system prompt and every
tool, then a user message asking for an ``<analysis>`` and a ``<summary>`` block. The CLI rewrites the summary
before carrying it into the next root (the analysis dropped, ``<summary>`` turned into ``Summary:``, blank lines
squeezed, after its own preamble), so it is never found verbatim. The views below are the shapes a real run
stored (tests/e2e/test_multiagent.py runs the CLI itself).
"""

from __future__ import annotations

import pytest
from traj_helpers import EOT, RecordTree

from harness_adapters.claude_code import SPEC
from polar.trajectory.choices import BuilderOptions, route_rewards, select_roles
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.records import CaptureRecord
from polar.trajectory.roles import CallView, Role, RoleHints, SessionRoles, label_session

HINTS = {"hints": SPEC.role_hints, "no hints": RoleHints()}
SYSTEM = "You are a Claude agent, built on Anthropic's Claude Agent SDK."
TOOLS = ("Agent", "Bash", "Edit", "Glob", "Grep", "Read", "Skill", "TodoWrite", "ToolSearch", "WebFetch", "Write")
REMINDER = "<system-reminder>\nAttribution for git commits: end them with Co-Authored-By.\n</system-reminder>\n\n"
TASK = REMINDER + "Create the file hello.txt containing exactly `hi` in the current directory, then show it with cat."
PATH = "/tmp/run/work/hello.txt"
COMPACT_PROMPT = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\n- Your entire response must be plain text: an "
    "<analysis> block followed by a <summary> block.\n\nYour task is to create a detailed summary of the "
    "conversation so far, paying close attention to the user's explicit requests and your previous actions."
)
BODY = (
    "1. Primary Request and Intent:\n   Create hello.txt containing hi, then show it with cat.\n\n\n"
    "2. Current Work:\n   hello.txt is written; next, check it with cat."
)
ANALYSIS = "<analysis>\nThe user asked for hello.txt holding hi; the Write call made it.\n</analysis>"
SUMMARY = f"{ANALYSIS}\n\n<summary>\n{BODY}\n</summary>"
PREAMBLE = (
    "This session is being continued from a previous conversation that ran out of context. The summary below "
    "covers the earlier portion of the conversation.\n\n<system-reminder>\n<tools-used-before-summary>Bash, Write"
    "</tools-used-before-summary>\n</system-reminder>\n"
)
TAIL = "\n\nContinue the conversation from where it left off without asking the user any further questions."
# Claude Code re-reads recent files into the new root: the Write call's path (an earlier tool argument) is there.
READ_BACK = (
    f'<system-reminder>\nCalled the Read tool with the following input: {{"file_path":"{PATH}"}}\n</system-reminder>'
)


def rewritten(summary_text: str) -> str:
    """What the CLI carries: the analysis dropped, the summary tag turned into "Summary:", blank lines squeezed."""
    body = summary_text.split("<summary>\n", 1)[1].split("\n</summary>", 1)[0]
    return PREAMBLE + "Summary:\n" + "\n".join(line for line in body.split("\n") if line) + TAIL


def session(carried: str | None = None, summary: str = SUMMARY) -> tuple[list[CaptureRecord], dict[int, CallView]]:
    """Main call 1 (Write), 2 (Bash), compaction 3 forked from 1, post-compaction root 4 (Bash) and 5 (final)."""
    tree = RecordTree()
    first = tree.add([1, 50, 51, 52, EOT, 1, 60], [10, 11, EOT])
    tree.add([*tree.sequence(first), 61, 62], [12, 13, EOT], first)
    tree.add([*tree.sequence(first), 63, 64, 65], [14, 15, 16, EOT], first)
    root = tree.add([1, 50, 51, 52, EOT, 1, 70, 71], [17, 18, EOT])
    tree.add([*tree.sequence(root), 72], [19, EOT], root)
    opening = rewritten(summary) if carried is None else carried
    views = {
        1: CallView(1, SYSTEM, (TASK,), (), TOOLS, "I will create the file.", (("Write", {"file_path": PATH}),)),
        2: CallView(2, SYSTEM, (TASK,), ("I will create the file.",), TOOLS, "Now I check it.", (("Bash", {}),)),
        3: CallView(3, SYSTEM, (TASK, COMPACT_PROMPT), ("I will create the file.",), TOOLS, summary),
        4: CallView(4, SYSTEM, (opening, READ_BACK), ("Now I check it.",), TOOLS, "Checking.", (("Bash", {}),)),
        5: CallView(5, SYSTEM, (opening, READ_BACK), ("Now I check it.", "Checking."), TOOLS, "All done."),
    }
    return tree.records, views


def trained(records: list[CaptureRecord], roles: SessionRoles) -> dict[tuple[int, ...], int]:
    """Loss tokens per trace under the default choices (main and sub-agent train; a COMPLETED rollout)."""
    options = BuilderOptions()
    traces = prefix_merge(records, roles=roles).traces
    chosen = select_roles(route_rewards(traces, 1.0, options.reward), options.train_roles)
    return {trace.capture_ids: trace.n_loss_tokens for trace in chosen}


@pytest.mark.parametrize("hints", HINTS.values(), ids=HINTS.keys())
def test_claude_code_compaction_is_recognised_and_its_continuation_trains(hints: RoleHints) -> None:
    records, views = session()
    assert BODY not in views[4].user_texts[0], "the CLI rewrote the summary: not carried verbatim"
    roles = label_session(records, views, hints)
    labels = {i: (label.role, label.link_id, label.compacted) for i, label in roles.starts.items()}
    assert labels == {1: (Role.MAIN, None, False), 3: (Role.COMPACTION, 1, False), 4: (Role.MAIN, 3, True)}
    assert roles.label_of(5).role is Role.MAIN
    result = prefix_merge(records, roles=roles)
    assert result.stats.break_causes.get("compaction") == 1
    by_start = {t.capture_ids[0]: t for t in result.traces}
    assert by_start[3].capture_ids == (3,) and by_start[3].role == "compaction"
    assert by_start[4].capture_ids == (4, 5) and by_start[4].compacted
    # The summary does not train; the main chain and its continuation after the compaction do, every token.
    assert trained(records, roles) == {(1, 2): 3 + 3, (3,): 0, (4, 5): 3 + 2}


@pytest.mark.parametrize("hints", HINTS.values(), ids=HINTS.keys())
def test_a_summary_carried_in_part_is_found(hints: RoleHints) -> None:
    """A line cut or escaped on the way still leaves most of the body: enough to recognise it."""
    carried = rewritten(SUMMARY).replace("2. Current Work:", "2. Current work (escaped):")
    records, views = session(carried)
    roles = label_session(records, views, hints)
    assert roles.label_of(4) == roles.starts[4] and roles.starts[4].compacted and roles.starts[4].link_id == 3
    carried = PREAMBLE + "Summary:\nhello.txt is written; next, check it with cat." + TAIL  # a quarter of it
    records, views = session(carried)
    roles = label_session(records, views, hints)
    assert roles.starts[4].compacted is (hints is SPEC.role_hints), "only the CLI's marker says so then"


def test_the_cli_marker_links_a_summary_too_short_to_match() -> None:
    """Claude Code took a scripted "More." as a summary: too short to prove a link by text, its preamble still
    says the root starts from a summary."""
    short = "More."
    records, views = session(PREAMBLE + "Summary:\n" + short + TAIL, summary=short)
    with_hints = label_session(records, views, SPEC.role_hints)
    assert (with_hints.starts[3].role, with_hints.starts[4].role, with_hints.starts[4].compacted) == (
        Role.COMPACTION,
        Role.MAIN,
        True,
    )
    # Without hints nothing proves it: the forked call stays in the main chain, the root is judged as any other.
    bare = label_session(records, views, RoleHints())
    assert 3 not in bare.starts and not bare.starts[4].compacted


def test_a_tool_offering_call_is_no_compaction_unless_its_summary_comes_back_as_the_clients_text() -> None:
    """The same fork whose reply comes back only as an assistant turn (a rebuilt history): no compaction."""
    records, views = session(REMINDER + "Create it.")
    views[4] = CallView(4, SYSTEM, (TASK, "next"), (SUMMARY,), TOOLS, "Checking.", (("Bash", {}),))
    roles = label_session(records, views, RoleHints())
    assert not roles.compaction_calls and roles.starts[4] == roles.label_of(4)
    assert roles.starts[4].role is Role.MAIN and not roles.starts[4].compacted


def test_a_main_agent_whose_task_mentions_summaries_is_no_compaction() -> None:
    """Every turn of a main agent asked to summarise has that request as its last user message: not new."""
    task = "Summarise the README in two lines."
    tree = RecordTree()
    first = tree.add([1, 50, EOT, 1, 60], [10, EOT])
    tree.add([*tree.sequence(first), 61], [11, EOT], first)
    tree.add([1, 50, EOT, 1, 62], [12, EOT])
    reply = "The README explains how to install and run the tool."
    views = {
        1: CallView(1, SYSTEM, (task,), (), TOOLS, "Reading it now.", (("Read", {"file_path": "README.md"}),)),
        2: CallView(2, SYSTEM, (task,), ("Reading it now.",), TOOLS, reply),
        3: CallView(3, SYSTEM, (task, f"Your answer was: {reply} Shorter, please."), (), TOOLS, "Shorter."),
    }
    roles = label_session(tree.records, views, RoleHints())
    assert not roles.compaction_calls
    assert [roles.label_of(i).role for i in (1, 2, 3)] == [Role.MAIN] * 3


@pytest.mark.parametrize(
    ("system", "tools", "role"),
    [
        (SYSTEM + " Today is Monday.", TOOLS, Role.MAIN),  # the system prompt changed, the tools did not
        (SYSTEM, (*TOOLS, "CronList"), Role.MAIN),  # a tool loaded, the system prompt the same
        ("You are another agent.", ("Bash",), Role.OTHER),  # a short opening alone proves nothing
    ],
)
def test_a_short_opening_task_keeps_the_main_role_with_the_same_system_prompt_or_tools(system, tools, role) -> None:
    tree = RecordTree()
    tree.add([1, 50, EOT, 1, 60], [10, EOT])
    tree.add([1, 51, EOT, 1, 60], [11, EOT])
    views = {
        1: CallView(1, SYSTEM, ("fix it",), (), TOOLS, "Looking"),
        2: CallView(2, system, ("fix it",), (), tools, "Ok"),
    }
    assert label_session(tree.records, views).label_of(2).role is role
