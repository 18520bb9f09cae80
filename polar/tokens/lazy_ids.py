"""Id sequences that are not copied whole on the way: a prompt known by its length, and a prompt made of its
parent's ids followed by what the turn adds.

An append-mode prompt is its parent's prompt and output followed by the turn's new ids. The gateway sends such a
prompt as JSON text it keeps per session (``polar.tokens.ids_json``) and records only the new ids, so on its way
nothing reads the parent's ids one by one: ``JoinedIds`` answers its length and its delta (a slice that starts past
the parent's ids) from the new ids alone, and ``LazyPrompt`` its length from a number. Anything else (iterating,
an index into the parent's part, ``int32``) makes the whole int32 array once, through ``LazyIds.whole``.
"""

from __future__ import annotations

from abc import abstractmethod
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import overload


def int32(ids: Sequence[int]) -> array[int]:
    """``ids`` as an int32 array (itself when it is one; a lazy sequence made whole at once): 4 bytes an id, where
    a list or tuple holds an int object of 28 bytes for every id past 256. A thousand calls in flight holding their
    prompts as tuples fragmented the gateway's small-object heap by about 100 KiB a call (bench_gateway_scale
    section 3)."""
    if isinstance(ids, array) and ids.typecode == "i":
        return ids
    return ids.whole() if isinstance(ids, LazyIds) else array("i", ids)


class LazyIds(Sequence[int]):
    """A sequence of ids made whole (an int32 array) only when read as a whole."""

    __slots__ = ()

    @abstractmethod
    def whole(self) -> array[int]:
        """All the ids, as an int32 array not to be changed (it may be one its source keeps)."""

    def __iter__(self) -> Iterator[int]:
        return iter(self.whole())

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...
    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        return self.whole()[index]


class LazyPrompt(LazyIds):
    """A prompt's ids, known by length; ``load`` gives them when they are read."""

    __slots__ = ("_length", "_load")

    def __init__(self, length: int, load: Callable[[], Sequence[int]]):
        self._length = length
        self._load = load

    def __len__(self) -> int:
        return self._length

    def whole(self) -> array[int]:
        return int32(self._load())


class JoinedIds(LazyIds):
    """``head`` then ``tail``, neither copied: its length, and any slice or index past ``head``, read without
    touching ``head`` (a turn's delta, the prompt's last ids). ``head`` may itself be lazy."""

    __slots__ = ("head", "tail", "_n")

    def __init__(self, head: Sequence[int], tail: Sequence[int]):
        self.head, self.tail = head, tail
        self._n = len(head)

    def __len__(self) -> int:
        return self._n + len(self.tail)

    def starts_with(self, prompt: Sequence[int], output: Sequence[int]) -> bool:
        """Whether this is ``prompt`` then ``output`` (those very objects) followed by the tail."""
        head = self.head
        return isinstance(head, JoinedIds) and head.head is prompt and head.tail is output

    def whole(self) -> array[int]:
        return int32(self.head) + int32(self.tail)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...
    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        n = self._n
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return self.whole()[index]
            if start >= n:
                return self.tail[start - n : max(stop - n, 0)]
            return int32(self.head[start : min(stop, n)]) + int32(self.tail[: max(stop - n, 0)])
        at = index + len(self) if index < 0 else index
        if n <= at < len(self):
            return self.tail[at - n]
        return self.whole()[index]
