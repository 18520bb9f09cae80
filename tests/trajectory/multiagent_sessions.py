"""Generated multi-agent sessions for the role property tests: a main agent that launches sub-agents through a
tool call, compacts (a tool-free summariser call, as a root or extending the chain it summarises, then a new
root that starts from the summary), asks for titles, fails calls and retries, with the true label of every
chain start. Tokens are plain ids; each capture's call view is built alongside, as the gateway would store it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from traj_helpers import RecordTree

from db.enums import CaptureStatus
from polar.trajectory.records import CaptureRecord
from polar.trajectory.roles import CallView, ChainLabel, Role, RoleHints

HINTS = RoleHints(
    sub_agent_tools={"spawn": "task"},
    compaction_markers=("COMPACT THE CONVERSATION",),
    title_markers=("title generator",),
)
MAIN_SYSTEM = "You are the main agent."
SUB_SYSTEM = "You are a helper agent."
TOOLS = ("bash", "spawn")
EVENTS = ("turn", "turn", "sub_agent", "compact_root", "compact_child", "title", "fail", "retry")


@dataclass
class Conversation:
    system: str
    tools: tuple[str, ...]
    users: list[str] = field(default_factory=list)
    assistants: list[str] = field(default_factory=list)


@dataclass
class MultiAgentSession:
    tree: RecordTree = field(default_factory=RecordTree)
    views: dict[int, CallView] = field(default_factory=dict)
    truth: dict[int, ChainLabel] = field(default_factory=dict)
    conversations: dict[int, Conversation] = field(default_factory=dict)

    @property
    def records(self) -> list[CaptureRecord]:
        return self.tree.records


class _Builder:
    def __init__(self, data: st.DataObject) -> None:
        self.data = data
        self.session = MultiAgentSession()
        self.counter = 0

    def text(self, kind: str) -> str:
        self.counter += 1
        return f"{kind} number {self.counter} of this generated session"

    def tokens(self, low: int, high: int) -> list[int]:
        return self.data.draw(st.lists(st.integers(10, 999), min_size=low, max_size=high))

    def call(
        self,
        conversation: Conversation,
        parent: CaptureRecord | None,
        *,
        reply: str,
        tool_calls: tuple[tuple[str, Any], ...] = (),
        failed: bool = False,
    ) -> CaptureRecord:
        tree = self.session.tree
        prompt = (tree.sequence(parent) if parent is not None else ()) + tuple(self.tokens(1, 6))
        output = () if failed else (*self.tokens(1, 8), 2)
        fields: dict[str, Any] = {"status": CaptureStatus.ERROR} if failed else {}
        record = tree.add(prompt, output, parent, prefix_len=len(tree.sequence(parent)) if parent else 0, **fields)
        self.session.conversations[record.id] = conversation
        self.session.views[record.id] = CallView(
            record.id,
            system=conversation.system,
            user_texts=tuple(conversation.users),
            assistant_texts=tuple(conversation.assistants),
            tools=conversation.tools,
            reply_text="" if failed else reply,
            reply_tool_calls=() if failed else tool_calls,
        )
        return record

    def extend(self, record: CaptureRecord, user: str) -> Conversation:
        """The conversation of a call that continues ``record``'s: its reply, then a new user turn."""
        old = self.session.conversations[record.id]
        reply = self.session.views[record.id].reply_text
        return Conversation(old.system, old.tools, [*old.users, user], [*old.assistants, reply])

    def agent_chain(self, start: CaptureRecord, turns: int) -> CaptureRecord:
        leaf = start
        for _ in range(turns):
            leaf = self.call(self.extend(leaf, self.text("tool result")), leaf, reply=self.text("step"))
        return leaf

    def label(self, record: CaptureRecord, role: Role, link: int | None = None, compacted: bool = False) -> None:
        self.session.truth[record.id] = ChainLabel(record.id, role, link, compacted)

    def run(self, events: int) -> MultiAgentSession:
        task = self.text("task")
        first = Conversation(MAIN_SYSTEM, TOOLS, [task])
        leaf = self.call(first, None, reply=self.text("plan"))
        self.label(leaf, Role.MAIN)
        for _ in range(events):
            event = self.data.draw(st.sampled_from(EVENTS))
            if event == "turn":
                leaf = self.call(self.extend(leaf, self.text("tool result")), leaf, reply=self.text("step"))
            elif event == "retry" and leaf.parent_id is not None:
                # The same request again (a retry): a second child of the parent, a branch.
                parent = self.session.tree.records[leaf.parent_id - 1]
                conversation = self.session.conversations[leaf.id]
                leaf = self.call(conversation, parent, reply=self.text("retried step"))
            elif event == "fail":
                failed = self.call(self.extend(leaf, self.text("tool result")), leaf, reply="", failed=True)
                if self.data.draw(st.booleans()):  # the harness goes on from the failed call's request
                    leaf = self.call(self.extend(failed, self.text("retry note")), failed, reply=self.text("step"))
            elif event == "sub_agent":
                prompt = self.text("sub-agent task")
                launch = self.call(
                    self.extend(leaf, self.text("tool result")),
                    leaf,
                    reply=self.text("delegating"),
                    tool_calls=(("spawn", {"task": prompt, "kind": "general"}),),
                )
                root = self.call(Conversation(SUB_SYSTEM, ("bash",), [prompt]), None, reply=self.text("sub step"))
                self.label(root, Role.SUB_AGENT, launch.id)
                sub_leaf = self.agent_chain(root, self.data.draw(st.integers(0, 3)))
                answer = self.session.views[sub_leaf.id].reply_text
                leaf = self.call(self.extend(launch, f"tool result: {answer}"), launch, reply=self.text("step"))
            elif event in ("compact_root", "compact_child"):
                summary = self.text("summary")
                if event == "compact_child":  # extends the chain it summarises (same tools), with the marker
                    conversation = self.extend(leaf, "COMPACT THE CONVERSATION now, please")
                    compaction = self.call(conversation, leaf, reply=summary)
                else:  # a tool-free root holding the transcript; the marker only sometimes
                    marker = self.data.draw(st.booleans())
                    old = self.session.conversations[leaf.id]
                    users = [*old.users, "COMPACT THE CONVERSATION" if marker else "Summarise the above."]
                    compaction = self.call(Conversation("You summarise.", (), users), None, reply=summary)
                self.label(compaction, Role.COMPACTION, leaf.id)
                agent = self.session.conversations[leaf.id]
                restart = Conversation(agent.system, agent.tools, [task, f"Earlier work, summarised: {summary}"])
                leaf = self.call(restart, None, reply=self.text("step"))
                self.label(leaf, Role.MAIN, compaction.id, compacted=True)
            elif event == "title":
                title = self.call(Conversation("You are a title generator.", (), [task]), None, reply="A title")
                self.label(title, Role.TITLE)
        return self.session


def multiagent_session(data: st.DataObject, events: int) -> MultiAgentSession:
    """A generated session of ``events`` events after the first main call (see the module docstring)."""
    return _Builder(data).run(events)
