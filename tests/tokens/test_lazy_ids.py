"""Lazy id sequences read like the list they stand for, and read their head only when they must."""

from __future__ import annotations

from array import array

from hypothesis import given
from hypothesis import strategies as st

from polar.tokens.lazy_ids import JoinedIds, LazyPrompt, int32

ids = st.lists(st.integers(0, 2**31 - 1), max_size=12)
index = st.integers(-30, 30)


class Unread(LazyPrompt):
    """A head that counts how often it was read whole."""

    def __init__(self, values: list[int]):
        self.reads = 0

        def load() -> array[int]:
            self.reads += 1
            return array("i", values)

        super().__init__(len(values), load)


@given(
    ids,
    ids,
    ids,
    st.one_of(index, st.tuples(st.none() | index, st.none() | index, st.none() | st.sampled_from([1, 2, -1]))),
)
def test_joined_ids_read_as_the_list_they_stand_for(prompt, output, tail, at):
    head = Unread(prompt)
    joined = JoinedIds(JoinedIds(head, array("i", output)), array("i", tail))
    whole = prompt + output + tail
    assert len(joined) == len(whole)
    if isinstance(at, tuple):
        assert list(joined[slice(*at)]) == whole[slice(*at)]
    elif -len(whole) <= at < len(whole):
        assert joined[at] == whole[at]
    assert list(joined) == whole and list(int32(joined)) == whole and isinstance(int32(joined), array)


def test_a_delta_and_the_last_ids_are_read_without_the_head():
    head = Unread([1, 2, 3])
    joined = JoinedIds(JoinedIds(head, array("i", [4, 5])), array("i", [6, 7, 8]))
    assert len(joined) == 8 and list(joined[5:]) == [6, 7, 8] and list(joined[-2:]) == [7, 8] and joined[-1] == 8
    assert isinstance(joined[5:], array) and head.reads == 0
    assert joined.starts_with(head, joined.head.tail) and not joined.starts_with(head, array("i", [4, 5]))
    assert list(joined[4:]) == [5, 6, 7, 8] and head.reads == 0  # the output is read, not the prompt
    assert joined[0] == 1 and head.reads == 1


def test_int32_keeps_an_array_and_copies_anything_else():
    kept = array("i", [1, 2])
    assert int32(kept) is kept
    assert int32((1, 2)) == kept and int32(LazyPrompt(2, lambda: (1, 2))) == kept
