"""A session's known call as the gateway's history holds it, and the line that holds a chain's ids once.

An agent's calls form a chain: each prompt is its parent's prompt and output followed by what the turn adds. A
session's ``Line`` holds that sequence once (the latest call's prompt, then its output); a call on the line keeps
only offsets into it, so a session's memory is its tokens, once, not a copy per kept prompt and delta. A call
that does not continue the line's latest call exactly (a branch, a second root, an output the next prompt cut)
keeps its own arrays.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import overload

from polar.tokens.ids_json import ids_text
from polar.tokens.messages import Message, Role, ToolSpec


def join_prefill(messages: tuple[Message, ...], reply: Message) -> tuple[tuple[Message, ...], Message]:
    """A call whose conversation ends with an assistant message (a prefill the model continued: Anthropic's
    assistant prefill) as the harness will echo it: the conversation before the prefill, and the prefill joined
    with the sampled continuation as the reply. The next request's history holds the joined text, which is what
    the call's prompt and output ids hold in that order, so it extends this call instead of reading as an edit."""
    if not messages or messages[-1].role is not Role.ASSISTANT or messages[-1].tool_calls:
        return messages, reply
    if messages[-1].digest is not None:  # sealed already (its text dropped): left as it was sent
        return messages, reply
    prefill = messages[-1]
    joined = Message(Role.ASSISTANT, prefill.content + reply.content, reply.reasoning, reply.tool_calls)
    return messages[:-1], joined


class LazyPrompt(Sequence[int]):
    """A prompt's ids, known by length; materialised only when iterated."""

    def __init__(self, length: int, load: Callable[[], Sequence[int]]):
        self._length = length
        self._load = load

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[int]:
        return iter(self._load())

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...
    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        return self._load()[index]


class Line:
    """A chain's ids in order: its latest call's prompt, then that call's output (int32: 4 bytes an id), and their
    JSON text in pieces (``polar.tokens.ids_json``), so the next prompt's text encodes only its new ids. Each piece
    after the first begins with its comma: a prompt's text is the pieces as they are, never walked piece by piece
    (a long session has hundreds). Only ever extended in place; readers get copies (slices), never views, so
    extending never fails."""

    __slots__ = ("ids", "tip", "text", "_tip_prompt", "_tip_pieces")

    def __init__(self) -> None:
        self.ids = array("i")
        self.tip: int | None = None  # the capture id whose prompt and output ``ids`` is
        self.text: list[bytes] = []  # a piece a call's prompt delta, then one its output (none for no ids)
        self._tip_prompt = 0  # the length of the tip's prompt
        self._tip_pieces = 0  # the pieces that hold it

    def extend(self, node: CallNode) -> bool:
        """Put ``node`` on the line if its prompt is the line followed by its delta (a root: on an empty line)."""
        exact = node.prefix_len == len(self.ids) and node.n_prompt == node.prefix_len + len(node.prompt_delta_ids)
        continues = node.parent_id == self.tip if node.parent_id is not None else self.tip is None
        if not (exact and continues):
            return False
        delta, output = node.prompt_delta_ids, node.output_ids
        self.ids.extend(delta)
        self._add_text(delta)
        self._tip_prompt, self._tip_pieces = len(self.ids), len(self.text)
        self.ids.extend(output)
        self._add_text(output)
        self.tip = node.id
        node.line = self
        node._delta = node._output = _EMPTY
        return True

    def prompt_text(self, parent_id: int | None, prefix_len: int, ids: Sequence[int]) -> tuple[bytes, ...] | None:
        """The JSON array of ``ids``, a prompt that keeps ``prefix_len`` ids of call ``parent_id``'s prompt and
        output (``polar.tokens.render.Prompt``), as parts to join: the line's pieces for what it keeps of the tip's
        ids, and the rest encoded. None when the parent is not the tip, or the prompt keeps less than its prompt."""
        if parent_id is None or parent_id != self.tip:
            return None
        if prefix_len == len(self.ids):
            n, pieces = prefix_len, self.text
        elif prefix_len >= self._tip_prompt:
            n, pieces = self._tip_prompt, self.text[: self._tip_pieces]
        else:
            return None
        tail = ids_text(ids[n:])
        return (b"[", *pieces, b"," if pieces and tail else b"", tail, b"]")

    def _add_text(self, ids: array[int]) -> None:
        piece = ids_text(ids)
        if piece:
            self.text.append(b"," + piece if self.text else piece)


_EMPTY = array("i")


class CallNode:
    """One known call: its place in the capture tree, its ids and the conversation it was made with."""

    __slots__ = (
        "id",
        "parent_id",
        "prefix_len",
        "n_prompt",
        "n_output",
        "messages",
        "tools",
        "reply",
        "seq",
        "minted",
        "line",
        "_delta",
        "_output",
    )

    def __init__(
        self,
        *,
        id: int,  # the capture id
        parent_id: int | None,
        prefix_len: int,
        prompt_delta_ids: array[int],  # int32: a session's ids can be many; 4 bytes each, not a tuple of ints
        output_ids: array[int],
        n_prompt: int,
        messages: tuple[Message, ...],
        tools: tuple[ToolSpec, ...],
        reply: Message,
        seq: int = -1,
        minted: frozenset[str] = frozenset(),  # the ids its reply went out with (polar.wire.replies.minted_ids)
    ):
        self.id, self.parent_id, self.prefix_len, self.n_prompt = id, parent_id, prefix_len, n_prompt
        self.n_output = len(output_ids)
        self.messages, self.reply = join_prefill(messages, reply)
        self.tools, self.seq = tools, seq
        self.minted = minted
        self.line: Line | None = None  # set by ``Line.extend``: the ids live there from then on
        self._delta, self._output = prompt_delta_ids, output_ids

    @property
    def prompt_delta_ids(self) -> array[int]:
        line = self.line
        return line.ids[self.prefix_len : self.n_prompt] if line is not None else self._delta

    @property
    def output_ids(self) -> array[int]:
        line = self.line
        return line.ids[self.n_prompt : self.n_prompt + self.n_output] if line is not None else self._output

    def prompt_on_line(self) -> array[int] | None:
        """The full prompt, when this call is on a line (a copy); None otherwise."""
        return self.line.ids[: self.n_prompt] if self.line is not None else None
