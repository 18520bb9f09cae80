"""A session's known call as the gateway's history holds it, and the line that holds a chain's ids once.

An agent's calls form a chain: each prompt is its parent's prompt and output followed by what the turn adds. A
session's ``Line`` holds that sequence once (the latest call's prompt, then its output); a call on the line keeps
only offsets into it, so a session's memory is its tokens, once, not a copy per kept prompt and delta. A call
that does not continue the line's latest call exactly (a branch, a second root, an output the next prompt cut)
keeps its own arrays.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections.abc import Sequence
from typing import overload

import numpy as np

from polar.tokens.ids_json import ids_text
from polar.tokens.lazy_ids import LazyIds
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


class Line:
    """A chain's ids in order: its latest call's prompt, then that call's output, held as their JSON text in pieces
    (``polar.tokens.ids_json``), so the next prompt's text encodes only its new ids and the ids are held once, as
    the text the engine is sent. Each piece after the first begins with its comma: a prompt's text is the pieces as
    they are, never walked piece by piece (a long session has hundreds).

    The ids themselves are read from the text only when something asks for ids before the tip's output (``ids``).
    A short stretch near the end (a chat format reading a prompt's last turn, ``LinePrompt``) is read from the
    pieces that hold it, and nothing is kept. A longer one (a call off the line rebuilding its prompt, an engine
    that takes whole id lists) makes the whole int32 array, which is kept and extended with the line from then on,
    so a session that needs it whole reads the text once. A steady session of a format that extends by the new ids
    alone (``JoinedIds``) never makes it. Only ever extended in place; readers get copies, never views, so
    extending never fails. A build in a worker thread may read while the event loop extends: the array is made
    and extended, and the pieces read, under the line's lock."""

    __slots__ = ("n", "tip", "text", "_starts", "_tip_output", "_tip_prompt", "_tip_pieces", "_ids", "_lock")

    def __init__(self) -> None:
        self.n = 0  # the ids on the line
        self.tip: int | None = None  # the capture id whose prompt and output the line is
        self.text: list[bytes] = []  # a piece a call's prompt delta, then one its output (none for no ids)
        self._starts: list[int] = []  # where each piece's ids start on the line
        # Where the tip's output starts on the line, and its ids: one tuple, so a reader gets a matching pair.
        self._tip_output: tuple[int, array[int]] = (0, _EMPTY)
        self._tip_prompt = 0  # the length of the tip's prompt
        self._tip_pieces = 0  # the pieces that hold it
        self._ids: array[int] | None = None  # the ids read from the text, once asked for
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.n

    @property
    def ids_read(self) -> bool:
        """Whether its ids were read from the text (and are kept beside it since)."""
        return self._ids is not None

    def extend(self, node: CallNode) -> bool:
        """Put ``node`` on the line if its prompt is the line followed by its delta (a root: on an empty line)."""
        exact = node.prefix_len == self.n and node.n_prompt == node.prefix_len + len(node.prompt_delta_ids)
        continues = node.parent_id == self.tip if node.parent_id is not None else self.tip is None
        if not (exact and continues):
            return False
        delta, output = node.prompt_delta_ids, node.output_ids
        self._add(delta)
        self._tip_prompt, self._tip_pieces = self.n, len(self.text)
        self._add(output)
        self.tip, self._tip_output = node.id, (self._tip_prompt, output)
        node.line = self
        node._delta = node._output = _EMPTY
        return True

    def ids(self, start: int, stop: int, *, keep: bool = True) -> array[int]:
        """The line's ids ``start:stop`` (within its length), a new array: the tip's output read as it was kept,
        anything before it from the text. ``keep``: a long stretch makes the whole array, kept (a reader that reads
        it again: an engine that takes whole lists, a branch's rebuild); else the pieces that hold it are read,
        whatever its length, and nothing is kept (a chat format searching a prompt's end for its last turn)."""
        output_start, output = self._tip_output
        if start >= output_start and stop <= output_start + len(output):
            return output[start - output_start : stop - output_start]
        with self._lock:
            if self._ids is None:
                first = bisect.bisect_right(self._starts, start) - 1
                last = bisect.bisect_left(self._starts, stop)
                held = (self._starts[last] if last < len(self._starts) else self.n) - self._starts[first]
                if not keep or held * 4 <= self.n:  # a short stretch (a prompt's last turn): its pieces alone
                    return self._stretch(first, last, start, stop)
                self._ids = _parsed(self.text)
            return self._ids[start:stop]

    def _stretch(self, first: int, last: int, start: int, stop: int) -> array[int]:
        """Ids ``start:stop`` from pieces ``first:last``, parsed from id ``start`` on: the first piece is cut at the
        comma before it, found by numpy in its bytes (a stretch at the end of a long opening parses only itself)."""
        piece = self.text[first]
        commas = start - self._starts[first] + (1 if first else 0)  # before id ``start`` (a later piece opens with one)
        if commas:
            piece = piece[int(np.flatnonzero(np.frombuffer(piece, np.uint8) == 0x2C)[commas - 1]) + 1 :]
        return _parsed([piece, *self.text[first + 1 : last]])[: stop - start]

    def prompt_text(self, parent_id: int | None, prefix_len: int, ids: Sequence[int]) -> tuple[bytes, ...] | None:
        """The JSON array of ``ids``, a prompt that keeps ``prefix_len`` ids of call ``parent_id``'s prompt and
        output (``polar.tokens.render.Prompt``), as parts to join: the line's pieces for what it keeps of the tip's
        ids, and the rest encoded. None when the parent is not the tip, or the prompt keeps less than its prompt."""
        if parent_id is None or parent_id != self.tip:
            return None
        if prefix_len == self.n:
            n, pieces = prefix_len, self.text
        elif prefix_len >= self._tip_prompt:
            n, pieces = self._tip_prompt, self.text[: self._tip_pieces]
        else:
            return None
        tail = ids_text(ids[n:])
        return (b"[", *pieces, b"," if pieces and tail else b"", tail, b"]")

    def _add(self, ids: array[int]) -> None:
        piece = ids_text(ids)
        if piece:
            with self._lock:
                self.text.append(b"," + piece if self.text else piece)
                self._starts.append(self.n)
                self.n += len(ids)
                if self._ids is not None:
                    self._ids.extend(ids)


_EMPTY = array("i")


def _parsed(pieces: list[bytes]) -> array[int]:
    """The ids of consecutive pieces (the first without a leading comma), as an int32 array."""
    return array("i", np.fromstring(b"".join(pieces), dtype=np.int32, sep=",").tobytes())


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
        return line.ids(self.prefix_len, self.n_prompt) if line is not None else self._delta

    @property
    def output_ids(self) -> array[int]:
        line = self.line
        return line.ids(self.n_prompt, self.n_prompt + self.n_output) if line is not None else self._output

    def prompt_on_line(self) -> LinePrompt | None:
        """The full prompt, when this call is on a line (read from it only as far as it is read); None otherwise."""
        line = self.line
        return LinePrompt(line, self.n_prompt) if line is not None else None


class LinePrompt(LazyIds):
    """A prompt on a line, known by its length: a slice read from the pieces of the line that hold it (a chat format
    reading the prompt's last turn), nothing kept; anything else from the whole array the line then keeps."""

    __slots__ = ("_line", "_n")

    def __init__(self, line: Line, n: int):
        self._line, self._n = line, n

    def __len__(self) -> int:
        return self._n

    def whole(self) -> array[int]:
        return self._line.ids(0, self._n)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...
    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._n)
            if step == 1:
                return self._line.ids(start, max(start, stop), keep=False)
        return self.whole()[index]
