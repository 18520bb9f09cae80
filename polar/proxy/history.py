"""A session's earlier calls, as the prompt builder needs them (append mode, DESIGN §2.2).

The store is the truth: any gateway process may have written a session's captures. Each process keeps a
cache of the calls it has seen; on every call it lists the session's capture ids (one light query) and
loads only captures it does not know yet (written by another process, or before a restart) by decoding
their stored request with its protocol codec and re-parsing the sampled ids.

Memory stays proportional to the session's tokens, not turns × context: a call keeps only its prompt
delta (full prompts are rebuilt from the tree on demand) and shares its history messages with its parent.
"""

from __future__ import annotations

import functools
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db import Capture, session_scope
from db.capture_tree import prompt_from_chain
from db.enums import CaptureStatus
from db.request_json import expand_request, full_request_json
from polar.proxy.canonical import ChatRequest
from polar.tokens.messages import Message, ToolSpec
from polar.tokens.render import PriorCall


class LazyPrompt(Sequence[int]):
    """A prompt's ids, known by length; materialised from the capture tree only when iterated."""

    def __init__(self, length: int, load: Callable[[], list[int]]):
        self._length = length
        self._load = load

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[int]:
        return iter(self._load())

    def __getitem__(self, index):
        return self._load()[index]


@dataclass(eq=False)
class CallNode:
    id: int  # the capture id
    parent_id: int | None
    prefix_len: int
    prompt_delta_ids: array  # int32: a session's ids can be many; 4 bytes each, not a tuple of ints
    output_ids: array
    n_prompt: int
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    reply: Message


@dataclass(eq=False)
class SessionHistory:
    nodes: dict[int, CallNode] = field(default_factory=dict)  # in seq order
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Full request bodies of the latest calls: the next call is stored relative to its parent's (db.request_json);
    # older ones are rebuilt from the store when needed, so memory does not grow with the turns.
    bodies: OrderedDict[int, Any] = field(default_factory=OrderedDict)

    def remember_body(self, capture_id: int, body: Any, keep: int = 4) -> None:
        self.bodies[capture_id] = body
        while len(self.bodies) > keep:
            self.bodies.popitem(last=False)

    def chain(self, capture_id: int) -> list[CallNode]:
        """Root-first chain ending at ``capture_id``."""
        out: list[CallNode] = []
        node: CallNode | None = self.nodes[capture_id]
        while node is not None:
            out.append(node)
            node = self.nodes.get(node.parent_id) if node.parent_id is not None else None
        return out[::-1]

    def full_prompt(self, capture_id: int) -> list[int]:
        return prompt_from_chain(self.chain(capture_id))

    def prior_calls(self) -> list[PriorCall]:
        return [
            PriorCall(
                n.messages,
                n.tools,
                n.reply,
                LazyPrompt(n.n_prompt, functools.partial(self.full_prompt, n.id)),
                n.output_ids,
                ref=n.id,
            )
            for n in self.nodes.values()
        ]

    @property
    def tool_steps(self) -> int:
        """How many earlier calls offered tools (the scripted policy's cursor)."""
        return sum(1 for n in self.nodes.values() if n.tools)

    def messages_sharing_parent(self, parent_id: int | None, messages: tuple[Message, ...]) -> tuple[Message, ...]:
        """``messages`` with the part its parent already holds replaced by the parent's own objects."""
        parent = self.nodes.get(parent_id) if parent_id is not None else None
        if parent is None:
            return messages
        return (*parent.messages, *messages[len(parent.messages) :])


class HistoryCache:
    """Per-process cache of session histories, refreshed from the store on every call."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        decode_request: Callable[[str, dict, str], ChatRequest],
        parse_reply: Callable[[Sequence[int], Sequence[int]], Message],  # (sampled ids, the prompt's last ids)
        max_sessions: int = 10_000,
    ):
        self._factory = factory
        self._decode_request = decode_request
        self._parse_reply = parse_reply
        self._max = max_sessions
        self._sessions: OrderedDict[str, SessionHistory] = OrderedDict()
        self._lock = threading.Lock()

    def _history(self, session_id: str) -> SessionHistory:
        with self._lock:
            history = self._sessions.pop(session_id, None) or SessionHistory()
            self._sessions[session_id] = history
            while len(self._sessions) > self._max:
                self._sessions.popitem(last=False)
            return history

    def load(self, session_id: str) -> SessionHistory:
        """The session's OK captures, in seq order (blocking: call from a worker thread)."""
        history = self._history(session_id)
        with session_scope(self._factory) as db:
            ids = db.scalars(
                sa.select(Capture.id)
                .where(Capture.rollout_id == session_id, Capture.status == CaptureStatus.OK)
                .order_by(Capture.seq)
            ).all()
            with history.lock:
                missing = [i for i in ids if i not in history.nodes]
                if missing:
                    # Bodies are stored relative to their parents: rebuild them in seq order (parents first).
                    rows = db.scalars(
                        sa.select(Capture).where(Capture.rollout_id == session_id).order_by(Capture.seq)
                    ).all()
                    bodies: dict[int, Any] = {}
                    for row in rows:
                        parent = bodies.get(row.parent_id) if row.parent_id is not None else None
                        bodies[row.id] = expand_request(row.request_json, parent)
                    by_id = {row.id: row for row in rows}
                    known = dict(history.nodes)
                    known.update({i: self._node(by_id[i], bodies[i]) for i in missing})
                    history.nodes = {i: known[i] for i in ids}
                    if ids:
                        history.remember_body(ids[-1], bodies[ids[-1]])
        return history

    def _node(self, row: Capture, body: Any) -> CallNode:
        request = self._decode_request(row.protocol, body, row.model)
        return CallNode(
            id=row.id,
            parent_id=row.parent_id,
            prefix_len=row.prefix_len,
            prompt_delta_ids=array("i", row.prompt_delta_ids),
            output_ids=array("i", row.output_ids),
            n_prompt=row.n_prompt,
            messages=request.messages,
            tools=request.tools,
            reply=self._parse_reply(row.output_ids, row.prompt_delta_ids),
        )

    def add(self, session_id: str, node: CallNode) -> None:
        history = self._history(session_id)
        with history.lock:
            node.messages = history.messages_sharing_parent(node.parent_id, node.messages)
            history.nodes[node.id] = node

    def parent_body(self, session_id: str, parent_id: int) -> Any:
        """The full request of capture ``parent_id`` (from memory, else rebuilt from the store)."""
        history = self._history(session_id)
        with history.lock:
            if parent_id in history.bodies:
                return history.bodies[parent_id]
        with session_scope(self._factory) as db:
            capture = db.get(Capture, parent_id)
            return full_request_json(db, capture) if capture is not None else None

    def remember_body(self, session_id: str, capture_id: int, body: Any) -> None:
        history = self._history(session_id)
        with history.lock:
            history.remember_body(capture_id, body)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)
