"""Multi-agent sessions of the real CLIs, network-isolated, under the scripted policy (issue 16).

- Claude Code launches a sub-agent with its Agent tool; the sub-agent runs its own shell call. Both chains are
  captured, the sub-agent's root is labelled ``sub_agent`` and linked to the main call that sampled the Agent
  call (whose prompt argument is the sub-agent's first user message), and both train.
- Codex (``model_auto_compact_token_limit``), OpenCode (a small declared context limit) and Claude Code
  (``CLAUDE_AUTOCOMPACT_PCT_OVERRIDE``) compact: each compaction call is labelled ``compaction`` and linked to the
  chain it summarised, each post-compaction root is linked to its compaction call and starts from the summary
  (Claude Code's rewritten: its compaction call offers every tool and forks from the main conversation, and the
  CLI drops the analysis and turns the summary tag into "Summary:"); the compaction summaries do not train, the
  main agent's calls after the compaction do.
- OpenCode's title call is labelled ``title`` and does not train.

Labels are checked twice: with the adapter's role hints and from structure alone (no hints).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from db import make_engine, make_session_factory, session_scope
from harness_adapters import ADAPTERS
from polar.trajectory.call_views import load_call_views
from polar.trajectory.choices import BuilderOptions, route_rewards, select_roles
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.records import BuildResult
from polar.trajectory.roles import CallView, Role, RoleHints, SessionRoles, label_session
from polar.trajectory.store import load_capture_records
from tests.e2e.multiagent import CLAUDE_SUMMARY, CLAUDE_SUMMARY_BODY, SCENARIOS, SUB_MARKER, SUB_PROMPT, SUMMARY
from tests.e2e.sandbox import Isolation, isolation

pytestmark = pytest.mark.e2e

CLI_TIMEOUT_S = 240
ADAPTER_OF = {
    "claude-subagent": "claude_code",
    "codex-compact": "codex",
    "opencode-compact": "opencode",
    "claude-compact": "claude_code",
}
# Each compaction scenario's scripted summary, and what of it the next root carries (whitespace aside).
SUMMARIES = {
    "codex-compact": (SUMMARY, SUMMARY),
    "opencode-compact": (SUMMARY, SUMMARY),
    "claude-compact": (CLAUDE_SUMMARY, "Summary: " + " ".join(CLAUDE_SUMMARY_BODY.split())),
}


@pytest.fixture(scope="module")
def isolated() -> Isolation:
    found = isolation()
    if found is None:
        pytest.skip("cannot create a network namespace here (`unshare -n` is not permitted or unshare/ip are missing)")
    return found


class Session:
    """One scenario's captures, views and labels, with and without the adapter's hints."""

    def __init__(self, name: str, result: dict) -> None:
        engine = make_engine(result["database_url"])
        try:
            with session_scope(make_session_factory(engine)) as db:
                self.records = load_capture_records(db, result["session_id"])
                self.views: dict[int, CallView] = load_call_views(db, result["session_id"])
        finally:
            engine.dispose()
        self.roles = label_session(self.records, self.views, ADAPTERS[ADAPTER_OF[name]].role_hints)
        self.structural = label_session(self.records, self.views, RoleHints())
        self.workdir = Path(result["workdir"])

    def build(self, roles: SessionRoles | None = None) -> BuildResult:
        return prefix_merge(self.records, roles=roles or self.roles)

    def trained(self, options: BuilderOptions | None = None) -> dict[str, int]:
        """Loss tokens by role after the task's choices (broadcast reward 1.0, a COMPLETED rollout)."""
        options = options or BuilderOptions()
        traces = select_roles(route_rewards(self.build().traces, 1.0, options.reward), options.train_roles)
        out: dict[str, int] = {}
        for trace in traces:
            out[trace.role] = out.get(trace.role, 0) + trace.n_loss_tokens
        return out

    def starts(self, role: Role) -> list[int]:
        return [i for i, label in self.roles.starts.items() if label.role is role]


def run(name: str, isolated: Isolation, cache: Path, tmp_path: Path) -> Session:
    harness = SCENARIOS[name]
    if not shutil.which("node"):
        pytest.skip("node is not installed")
    if not harness.installed:
        pytest.skip(f"{harness.package}@{harness.version} is not installed: run scripts/install_harnesses.sh")
    run_dir = tmp_path / name
    args = ["--harness", name, "--run-dir", str(run_dir), "--cache", str(cache), "--timeout", str(CLI_TIMEOUT_S)]
    proc = subprocess.run(
        isolated.command(args, run_dir), check=False, capture_output=True, text=True, timeout=CLI_TIMEOUT_S + 120
    )
    result_path = run_dir / "result.json"
    assert proc.returncode == 0 and result_path.exists(), f"runner failed: {proc.stdout[-2000:]}{proc.stderr[-4000:]}"
    result = json.loads(result_path.read_text())
    assert not result["timed_out"] and result["exit_code"] == 0, (run_dir / "cli.stderr").read_text()[-4000:]
    session = Session(name, result)
    for record, view in ((r, session.views[r.id]) for r in session.records):
        print(f"#{record.id} parent={record.parent_id} {session.roles.label_of(record.id)} system={view.system[:50]!r}")
    assert all(r.ok for r in session.records)
    return session


def check_invariants(session: Session) -> None:
    """Labels agree with and without hints (a title is known from the hints only); every split is counted;
    every sampled token trains once or is untrained with a reason, and no real CLI's call is poisoned."""
    hinted = {i: label for i, label in session.roles.starts.items() if label.role is not Role.TITLE}
    structural = {i: session.structural.starts[i] for i in hinted}
    assert structural == hinted, "structure alone must give the same labels as the hints"
    result = session.build()
    stats = result.stats
    assert stats.traces_out == stats.roots + stats.breaks
    # A call the CLI sent again unchanged (a resent root) is a retry: one copy trains, the other is a dead branch.
    untrained = stats.untrained_tokens or {}
    assert stats.loss_tokens + sum(untrained.values()) == stats.sampled_tokens, untrained
    assert set(untrained) <= {"dead_branch"}, untrained
    assert {i for t in result.traces for i in t.capture_ids} == {r.id for r in session.records}
    for trace in result.traces:
        label = session.roles.label_of(trace.capture_ids[0])
        assert (trace.role, trace.source_capture_id, trace.compacted) == (
            label.role.value,
            label.link_id,
            label.compacted,
        )


def test_claude_code_sub_agent(isolated, long_model_cache, tmp_path) -> None:
    session = run("claude-subagent", isolated, long_model_cache, tmp_path)
    check_invariants(session)
    (main,) = session.starts(Role.MAIN)
    (sub,) = session.starts(Role.SUB_AGENT)
    launcher = session.roles.starts[sub].link_id
    assert launcher == main, "the sub-agent links to the main call that launched it"
    (call,) = session.views[launcher].reply_tool_calls
    assert call[0] == "Agent" and call[1]["prompt"] == SUB_PROMPT
    assert SUB_PROMPT in session.views[sub].user_texts[0]
    traces = {t.role: t for t in session.build().traces}
    assert set(traces) == {"main", "sub_agent"}
    # The sub-agent's chain holds its own tool call and the answer after the tool ran.
    sub_calls = traces["sub_agent"].capture_ids
    assert len(sub_calls) == 2 and any("Bash" == name for name, _ in session.views[sub_calls[0]].reply_tool_calls)
    assert SUB_MARKER in json.dumps(
        session.views[sub_calls[1]].user_texts + session.views[sub_calls[1]].assistant_texts
    ) or (SUB_MARKER in session.views[sub_calls[1]].reply_text)
    # run_in_background: false (the script's): the main agent's next call waits for the sub-agent's report.
    main_calls = traces["main"].capture_ids
    assert len(main_calls) == 3 and main_calls[1] > max(sub_calls), main_calls
    trained = session.trained()
    assert trained["main"] > 0 and trained["sub_agent"] > 0, trained
    assert (session.workdir / "hello.txt").read_text() == "hi"


@pytest.mark.parametrize("name", ["codex-compact", "opencode-compact", "claude-compact"])
def test_compaction(name, isolated, long_model_cache, tmp_path) -> None:
    session = run(name, isolated, long_model_cache, tmp_path)
    summary, carried = SUMMARIES[name]
    check_invariants(session)
    compactions = session.starts(Role.COMPACTION)
    assert compactions, f"{name} did not compact"
    post = [label for label in session.roles.starts.values() if label.compacted]
    assert post, f"{name} made no call after compacting"
    for label in post:
        assert label.role is Role.MAIN and label.link_id in compactions
        assert any(
            carried in " ".join(text.split())
            for text in (*session.views[label.capture_id].user_texts, *session.views[label.capture_id].assistant_texts)
        )
    for capture_id in compactions:
        summarised = session.roles.starts[capture_id].link_id
        assert summarised is not None and session.roles.label_of(summarised).role is Role.MAIN
        assert session.views[capture_id].reply_text.strip() == summary
    stats = session.build().stats
    assert stats.roots_by_role["compaction"] == len(compactions)
    trained = session.trained()
    assert trained.get("compaction", 0) == 0 and trained["main"] > 0
    assert session.trained(BuilderOptions(train_roles=(Role.MAIN, Role.COMPACTION)))["compaction"] > 0
    if name == "claude-compact":
        # The compaction forks from the main conversation with every tool; its reply is not carried verbatim.
        (compaction,) = compactions
        assert {r.id: r for r in session.records}[compaction].parent_id is not None and session.views[compaction].tools
        assert not any(CLAUDE_SUMMARY in t for t in session.views[post[0].capture_id].user_texts)
        # The root after it finishes the task as the main agent, and trains.
        (after,) = (t for t in session.build().traces if t.compacted)
        assert after.role == "main" and after.n_loss_tokens > 0
        assert (session.workdir / "hello.txt").read_text() == "hi"
    if name == "opencode-compact":
        (title,) = session.starts(Role.TITLE)
        assert trained.get("title", 0) == 0, "the title call does not train by default"
        assert session.trained(BuilderOptions(train_roles=(Role.MAIN, Role.TITLE)))["title"] > 0
