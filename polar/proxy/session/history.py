"""A session's earlier calls, as the prompt builder needs them (append mode).

The store is the truth: any gateway process (on this host or another) may have written a session's captures.
Each process keeps what it has seen and reads the store only for what it may lack, never the whole session:

- the first call of a session in this process loads its captures (written elsewhere or before a restart);
- ``seq`` numbers come from one counter per session (``CaptureWriter``), so a number this process skipped is
  a capture written elsewhere: the next call loads the captures from the lowest unknown seq on;
- a request holding an assistant message no known call explains (the previous turn went to another replica)
  loads them too, and is planned again.

Otherwise (the steady state: a session's calls reaching one process, one after the other) a call reads nothing.
A history belongs to one session key (``bind_key``): when the run stage launches a harness again it opens the
session with a new key, and every process starts that launch's history afresh; captures the store marks as not
OK (failed, or made by an interrupted launch) are never loaded as calls to extend.
Loading decodes each new capture's stored request with its protocol codec and re-parses its sampled ids.

Per-call cost does not grow with the number of earlier calls: candidates for the parent come from an index by depth
(the usual parent, the previous turn, is the first one tried), the chain's ids are held once, as the JSON text they
are sent as, extended in place (``polar.proxy.session.call_node.Line``), and the count of tool calls is kept as it
grows. Memory stays proportional to the session's tokens, not turns x context: a call on the line holds offsets
into it (one off it, its prompt delta and output), and shares its history messages with its parent. Those messages
are sealed (``Message.sealed``: a digest, a role and ids, no text), and of the latest bodies only digests are kept
(``polar.wire.body_digest``): a session holds its token ids, its replies, and about 16 bytes a message besides.
No lock here is held across I/O: reads run without one and are merged under it.
"""

from __future__ import annotations

import bisect
import functools
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db import Capture, session_scope
from db.capture_tree import prompt_from_chain
from db.enums import CaptureStatus
from db.request_json import expand_request, full_request_json
from polar.proxy.session.call_node import CallNode, Line
from polar.proxy.session.cut import KEEP, CutReply
from polar.tokens.lazy_ids import LazyPrompt, int32
from polar.tokens.messages import Message
from polar.tokens.render import PriorCall
from polar.wire.body_digest import BodyDigest, body_digest
from polar.wire.canonical import ChatRequest
from polar.wire.replies import minted_ids


@dataclass(frozen=True)
class LastRequest:
    """A session's latest decoded request: its protocol, its body's digest and its decode (messages sealed)."""

    protocol: str
    digest: BodyDigest
    request: ChatRequest


@dataclass(eq=False)
class SessionHistory:
    nodes: dict[int, CallNode] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Digests of the latest calls' request bodies: the next call is stored relative to its parent's
    # (db.request_json, polar.wire.body_digest); an older parent's body is read from the store when needed.
    digests: OrderedDict[int, BodyDigest] = field(default_factory=OrderedDict)
    # The session's chain of calls, its ids held once (polar.proxy.session.call_node); most calls are on it.
    line: Line = field(default_factory=Line)
    # Full prompts of the latest calls off the line (a branch's, say): the next call most likely extends one.
    prompts: OrderedDict[int, array[int]] = field(default_factory=OrderedDict)
    # (number of messages, seq, id), sorted: the parent search goes deepest first, latest first among equals.
    by_depth: list[tuple[int, int, int]] = field(default_factory=list)
    key_hash: str | None = None  # the session key these calls were made with (a new key: a new history)
    loaded: bool = False  # read from the store at least once in this process
    next_seq: int = 0  # every seq below is known here (a capture, or an error capture)
    ahead: set[int] = field(default_factory=set)  # known seqs above a gap (the gap: captures written elsewhere)
    tool_steps: int = 0  # how many known calls offered tools (the scripted policy's cursor)
    tool_free_steps: int = 0  # how many known calls offered none (the cursor of its tool-free replies)
    # The latest request decoded for this session; the next one re-sends most of it, and only what it adds is
    # checked and decoded again (polar.proxy.call.intake).
    last_request: LastRequest | None = None
    cut: tuple[CutReply, ...] = ()  # the latest replies cut mid-stream (polar.proxy.session.cut)

    @property
    def complete(self) -> bool:
        """Loaded, and no seq this process skipped: nothing is known to be missing."""
        return self.loaded and not self.ahead

    def note_seq(self, seq: int) -> None:
        if seq < self.next_seq:
            return
        self.ahead.add(seq)
        while self.next_seq in self.ahead:
            self.ahead.discard(self.next_seq)
            self.next_seq += 1

    def remember_digest(self, capture_id: int, digest: BodyDigest, keep: int = 4) -> None:
        self.digests[capture_id] = digest
        while len(self.digests) > keep:
            self.digests.popitem(last=False)

    def remember_prompt(self, capture_id: int, ids: Sequence[int], keep: int = 2) -> None:
        """Keep the full prompt of call ``capture_id``, a call off the line (the next call most likely extends
        it). The kept prompt of its parent, which it begins with, is dropped (``full_prompt`` slices it from this
        one): a chain off the line holds one, and two interleaved branches (subagents) one each."""
        self.prompts[capture_id] = int32(ids)
        node = self.nodes.get(capture_id)
        if node is not None and node.parent_id is not None and self._begins_with_parent(node):
            self.prompts.pop(node.parent_id, None)
        while len(self.prompts) > keep:
            self.prompts.popitem(last=False)

    def _begins_with_parent(self, node: CallNode) -> bool:
        """Whether ``node``'s prompt begins with its parent's whole prompt (it kept at least that much of it)."""
        parent = self.nodes.get(node.parent_id) if node.parent_id is not None else None
        return parent is not None and node.prefix_len >= parent.n_prompt

    def insert(self, node: CallNode) -> bool:
        """Add ``node`` unless known (on the line when it continues it), its messages sealed; True when it was new.
        Call with ``lock`` held."""
        if node.id in self.nodes:
            return False
        node.messages = self.messages_sharing_parent(node.parent_id, node.messages)
        self.nodes[node.id] = node
        self.line.extend(node)
        bisect.insort(self.by_depth, (len(node.messages), node.seq, node.id))
        self.tool_steps += 1 if node.tools else 0
        self.tool_free_steps += 0 if node.tools else 1
        if node.seq >= 0:
            self.note_seq(node.seq)
        return True

    def chain(self, capture_id: int) -> list[CallNode]:
        """Root-first chain ending at ``capture_id``."""
        out: list[CallNode] = []
        node: CallNode | None = self.nodes[capture_id]
        while node is not None:
            out.append(node)
            node = self.nodes.get(node.parent_id) if node.parent_id is not None else None
        return out[::-1]

    def full_prompt(self, capture_id: int) -> Sequence[int]:
        node = self.nodes[capture_id]
        on_line = node.prompt_on_line()
        if on_line is not None:
            return on_line
        kept = self.prompts.get(capture_id)
        if kept is not None:
            return kept
        for child_id, child_prompt in self.prompts.items():  # a kept prompt that begins with this one
            child = self.nodes.get(child_id)
            if child is not None and child.parent_id == capture_id and self._begins_with_parent(child):
                return child_prompt[: node.n_prompt]
        parent_node = self.nodes.get(node.parent_id) if node.parent_id is not None else None
        if parent_node is not None and parent_node.line is not None:  # a branch off the line: the parent's
            # prompt and output are a prefix of the line
            return parent_node.line.ids(0, node.prefix_len) + node.prompt_delta_ids
        parent = self.prompts.get(node.parent_id) if node.parent_id is not None else None
        if parent is not None and parent_node is not None:  # one step from a kept prompt: no walk to the root
            return (parent + parent_node.output_ids)[: node.prefix_len] + node.prompt_delta_ids
        return prompt_from_chain(self.chain(capture_id))

    def _prior(self, node: CallNode) -> PriorCall:
        # The tip's prompt is read from the line only if read (PromptBuilder._extend keeps it); others rebuilt if used.
        prompt = node.prompt_on_line() if node.id == self.line.tip else self.prompts.get(node.id)
        return PriorCall(
            node.messages,
            node.tools,
            node.reply,
            prompt if prompt is not None else LazyPrompt(node.n_prompt, functools.partial(self.full_prompt, node.id)),
            node.output_ids,
            ref=node.id,
            minted=node.minted,
        )

    def candidates(self, n_messages: int) -> Iterator[PriorCall]:
        """Earlier calls that a request of ``n_messages`` messages could extend (fewer messages), deepest
        first and latest first among equals; lazy, so the usual match (the previous turn) costs one."""
        end = bisect.bisect_left(self.by_depth, (n_messages, -1, -1))
        for i in range(end - 1, -1, -1):
            node = self.nodes.get(self.by_depth[i][2])
            if node is not None:
                yield self._prior(node)

    def same_depth(self, n_messages: int) -> Iterator[PriorCall]:
        """Earlier calls made with exactly ``n_messages`` messages (a retry's siblings share one depth)."""
        start = bisect.bisect_left(self.by_depth, (n_messages, -1, -1))
        end = bisect.bisect_left(self.by_depth, (n_messages + 1, -1, -1))
        for _, _, node_id in self.by_depth[start:end]:
            node = self.nodes.get(node_id)
            if node is not None:
                yield self._prior(node)

    def known_calls(self) -> list[CallNode]:
        """Every known call, in seq order, as the history holds it (for admission: no prompt is built or copied)."""
        return sorted(self.nodes.values(), key=lambda n: n.seq)

    def messages_sharing_parent(self, parent_id: int | None, messages: tuple[Message, ...]) -> tuple[Message, ...]:
        """``messages`` sealed (``Message.sealed``), the part its parent already holds as the parent's own objects."""
        parent = self.nodes.get(parent_id) if parent_id is not None else None
        held = parent.messages if parent is not None else ()
        return (*held, *(message.sealed for message in messages[len(held) :]))


class HistoryCache:
    """Per-process cache of session histories, extended from the store only with what it lacks."""

    def __init__(
        self,
        factory: sessionmaker[Session],
        # (protocol, body, model, (parent body, parent decode) or None): a stored request decoded again.
        decode_request: Callable[[str, dict[str, Any], str, tuple[Any, ChatRequest] | None], ChatRequest],
        parse_reply: Callable[[Sequence[int], Sequence[int]], Message],  # (sampled ids, the prompt's last ids)
        max_sessions: int = 10_000,
    ):
        self._factory = factory
        self._decode_request = decode_request
        self._parse_reply = parse_reply
        self._max = max_sessions
        self._sessions: OrderedDict[str, SessionHistory] = OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0  # store reads made (for tests and benchmarks)

    def _history(self, session_id: str) -> SessionHistory:
        with self._lock:
            history = self._sessions.pop(session_id, None) or SessionHistory()
            self._sessions[session_id] = history
            while len(self._sessions) > self._max:
                self._sessions.popitem(last=False)
            return history

    def bind_key(self, session_id: str, key_hash: str | None) -> None:
        """The session is reached with ``key_hash`` now: a history kept under another key is dropped (the
        harness was launched again; its earlier launch's captures are set aside in the store, and a load skips
        them). Called by the session store whenever it reads or opens a session."""
        with self._lock:
            history = self._sessions.get(session_id)
            # A history of no known key (evicted and rebuilt in between) is read again from the store, the truth.
            if history is None or history.key_hash != key_hash:
                self._sessions.pop(session_id, None)
                self._sessions[session_id] = SessionHistory(key_hash=key_hash)
                while len(self._sessions) > self._max:
                    self._sessions.popitem(last=False)

    def opened(self, session_id: str) -> None:
        """A session just created here for a new rollout has no calls yet: its first call reads nothing. (A call
        made meanwhile through another replica is still found: by its seq, or by its reply in the next request.)"""
        with self._lock:
            history = self._sessions.get(session_id)
            if history is not None and not history.nodes and history.next_seq == 0:
                history.loaded = True

    def cached(self, session_id: str) -> SessionHistory | None:
        """The session's history when nothing is known to be missing (no I/O); None: ``load`` first."""
        history = self._history(session_id)
        return history if history.complete else None

    def load(self, session_id: str) -> SessionHistory:
        """Extend the session's history with the captures this process lacks: those from its lowest unknown
        seq on (blocking: call from a worker thread)."""
        history = self._history(session_id)
        with history.lock:
            since = history.next_seq
        self.loads += 1
        with session_scope(self._factory) as db:
            rows = db.scalars(
                sa.select(Capture).where(Capture.rollout_id == session_id, Capture.seq >= since).order_by(Capture.seq)
            ).all()
            # Bodies are stored relative to their parents: rebuilt in seq order (parents first).
            bodies: dict[int, Any] = {}
            read: dict[int, CallNode] = {}  # the nodes made here, by id (in seq order)
            for row in rows:
                if row.id in history.nodes or row.status != CaptureStatus.OK:
                    continue
                parent, prior = None, None
                if row.parent_id is not None:
                    parent = bodies.get(row.parent_id)
                    if parent is None:
                        parent_row = db.get(Capture, row.parent_id)
                        parent = full_request_json(db, parent_row) if parent_row is not None else None
                    known = history.nodes.get(row.parent_id) or read.get(row.parent_id)
                    if parent is not None and known is not None:  # decode only what the call adds to its parent
                        prior = (parent, ChatRequest(row.model, known.messages, known.tools))
                bodies[row.id] = expand_request(row.request_json, parent)
                read[row.id] = self._node(row, bodies[row.id], prior)
            nodes = list(read.values())
            seqs = [row.seq for row in rows]
        with history.lock:
            for node in nodes:
                history.insert(node)
            for seq in seqs:
                history.note_seq(seq)
            history.ahead = {s for s in history.ahead if s >= history.next_seq}
            if seqs:  # every seq up to the highest read is accounted for now
                for seq in range(since, max(seqs) + 1):
                    history.note_seq(seq)
            digest = body_digest(bodies[nodes[-1].id]) if nodes else None
            if digest is not None:
                history.remember_digest(nodes[-1].id, digest)
            history.loaded = True
        return history

    def _node(self, row: Capture, body: Any, prior: tuple[Any, ChatRequest] | None = None) -> CallNode:
        request = self._decode_request(row.protocol, body, row.model, prior)
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
            seq=row.seq,
            minted=minted_ids(row.protocol, row.response_json),  # from the record: the ids the harness got
        )

    def add(self, session_id: str, node: CallNode, prompt_ids: Sequence[int] | None = None) -> None:
        """A call this process just committed (``node.seq`` set), with its full prompt when known."""
        history = self._history(session_id)
        with history.lock:
            decoded = node.messages
            history.insert(node)
            last = history.last_request
            held = last.request.messages if last is not None else ()
            if last is not None and len(held) == len(decoded) and held and held[-1] is decoded[-1].sealed:
                # The next request is decoded on top of this one (``last_request``): holding the node's own
                # objects, its history is matched to this call by identity, not compared message by message.
                history.last_request = replace(last, request=replace(last.request, messages=node.messages))
            if prompt_ids is not None and node.line is None:
                # A root's full prompt is its delta: one array for both, not two copies.
                full = node.prompt_delta_ids if node.prefix_len == 0 and node.parent_id is None else prompt_ids
                history.remember_prompt(node.id, full)

    def drop(self, session_id: str, capture_id: int) -> None:
        """Forget call ``capture_id`` as a parent (its reply never reached its caller); its seq stays known. Its ids
        stay on the line if they are there: the line is only ever extended, and no later call continues it."""
        history = self._history(session_id)
        with history.lock:
            node = history.nodes.pop(capture_id, None)
            if node is not None:
                history.by_depth.remove((len(node.messages), node.seq, node.id))
                history.prompts.pop(capture_id, None)
                history.digests.pop(capture_id, None)

    def note_cut(self, session_id: str, cut: CutReply) -> None:
        """A reply its client cut mid-stream (never a node): admission reads it in the requests that follow."""
        history = self._history(session_id)
        with history.lock:
            history.cut = (*history.cut[-(KEEP - 1) :], cut)

    def note_seq(self, session_id: str, seq: int) -> None:
        """A seq this process used without a node (an error capture)."""
        history = self._history(session_id)
        with history.lock:
            history.note_seq(seq)

    def digest_in_memory(self, session_id: str, capture_id: int) -> BodyDigest | None:
        history = self._history(session_id)
        with history.lock:
            return history.digests.get(capture_id)

    def parent_body(self, session_id: str, parent_id: int) -> Any:
        """The full request of capture ``parent_id``, rebuilt from the store (blocking)."""
        with session_scope(self._factory) as db:
            capture = db.get(Capture, parent_id)
            return full_request_json(db, capture) if capture is not None else None

    def remember_digest(self, session_id: str, capture_id: int, digest: BodyDigest) -> None:
        history = self._history(session_id)
        with history.lock:
            history.remember_digest(capture_id, digest)

    def last_request(self, session_id: str) -> LastRequest | None:
        """The session's latest decoded request, if this process holds its history (no I/O)."""
        history = self._sessions.get(session_id)
        return history.last_request if history is not None else None

    def remember_request(self, session_id: str, protocol: str, digest: BodyDigest, request: ChatRequest) -> None:
        """The session's latest request (a body gone ``parse_json_after``'s strict way), its messages sealed."""
        history = self._history(session_id)
        kept = history.last_request.request.messages if history.last_request is not None else ()
        n = len(kept) if request.messages[: len(kept)] == kept else 0  # decoded on it: those are sealed already
        messages = kept[:n] + tuple(message.sealed for message in request.messages[n:])
        history.last_request = LastRequest(protocol, digest, replace(request, messages=messages))

    def forget_request(self, session_id: str) -> None:
        history = self._sessions.get(session_id)
        if history is not None:
            history.last_request = None

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)
