"""A session's line holds a chain's ids once; calls that do not continue it exactly keep their own, and every
call's ids read the same either way. The line's ids are kept as JSON too, so a prompt extending its tip is sent
with only its new ids encoded."""

from __future__ import annotations

from array import array

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.proxy.session.call_node import CallNode, Line
from polar.tokens.ids_json import ids_text, json_array
from polar.tokens.messages import Message, Role


def node(id: int, parent_id: int | None, prefix_len: int, delta: list[int], output: list[int]) -> CallNode:
    return CallNode(
        id=id,
        parent_id=parent_id,
        prefix_len=prefix_len,
        prompt_delta_ids=array("i", delta),
        output_ids=array("i", output),
        n_prompt=prefix_len + len(delta),
        messages=(),
        tools=(),
        reply=Message(Role.ASSISTANT, "ok"),
    )


def test_a_chain_goes_on_the_line_and_reads_the_same():
    line = Line()
    root, child = node(1, None, 0, [1, 2, 3], [4, 5]), node(2, 1, 5, [6], [7])
    assert line.extend(root) and line.extend(child)
    assert line.tip == 2 and len(line) == 7
    # The tip's prompt and output are read without the line's ids: its length, and its output as it was kept.
    assert len(child.prompt_on_line() or ()) == 6 and list(child.output_ids) == [7] and not line.ids_read
    assert list(line.ids(0, len(line))) == [1, 2, 3, 4, 5, 6, 7] and line.ids_read
    assert (list(root.prompt_delta_ids), list(root.output_ids)) == ([1, 2, 3], [4, 5])
    assert (list(child.prompt_delta_ids), list(child.output_ids)) == ([6], [7])
    assert list(child.prompt_on_line() or []) == [1, 2, 3, 4, 5, 6]
    assert line.extend(node(3, 2, 7, [8, 9], [10]))  # read once, the ids are extended with the line
    assert list(line.ids(5, 10)) == [6, 7, 8, 9, 10]


def test_calls_that_do_not_continue_the_line_keep_their_own_ids():
    line = Line()
    assert line.extend(node(1, None, 0, [1, 2], [3]))
    cut = node(2, 1, 2, [9], [8])  # the next prompt kept only part of the output
    branch = node(3, 1, 3, [5], [6])
    second_root = node(4, None, 0, [7], [7])
    assert not line.extend(cut) and cut.line is None and list(cut.prompt_delta_ids) == [9]
    assert line.extend(branch)  # the tip's exact continuation
    assert not line.extend(node(5, 1, 3, [4], [4]))  # a sibling: the line's tip is 3 now
    assert not line.extend(second_root) and list(second_root.output_ids) == [7]
    assert list(line.ids(0, len(line))) == [1, 2, 3, 5, 6]


def test_a_prompt_on_the_tip_is_sent_as_the_lines_text_and_its_new_ids():
    """``prompt_text`` joins to the bytes ``orjson.dumps`` gives for the whole prompt, whether the prompt keeps the
    tip's whole output, part of it, or none (an empty output too); a prompt that keeps less than the tip's prompt,
    or extends another call, gets None (its ids are encoded whole)."""
    line = Line()
    assert line.extend(node(1, None, 0, [101, 2, 30003], [4, 5]))
    assert line.extend(node(2, 1, 5, [6], [70, 8]))
    whole = [101, 2, 30003, 4, 5, 6, 70, 8]
    for prefix_len, new in [(8, [7, 8]), (8, []), (7, [9]), (6, [10, 11])]:
        ids = array("i", whole[:prefix_len] + new)
        parts = line.prompt_text(2, prefix_len, ids)
        assert parts is not None and b"".join(parts) == orjson.dumps(list(ids)), prefix_len
    assert line.prompt_text(2, 5, array("i", whole[:5] + [1])) is None  # keeps less than the tip's prompt
    assert line.prompt_text(1, 5, array("i", whole[:5] + [1])) is None  # extends an earlier call
    assert line.prompt_text(None, 0, array("i", [1])) is None
    empty = Line()
    assert empty.extend(node(1, None, 0, [3], []))  # an empty output: a piece of nothing
    assert b"".join(empty.prompt_text(1, 1, array("i", [3, 4])) or ()) == b"[3,4]"


def test_the_ids_text_of_any_ids_is_orjsons():
    for ids in ([], [0], [1, 151_000, 7], list(range(1000))):
        assert b"".join(json_array([ids_text(array("i", ids))])) == orjson.dumps(ids)
        assert b"".join(json_array([ids_text(ids[:1]), b"", ids_text(tuple(ids[1:]))])) == orjson.dumps(ids)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 200_000), min_size=0, max_size=40), min_size=1, max_size=12),
    st.data(),
)
def test_a_stretch_of_the_line_reads_the_same_from_its_pieces(turns: list[list[int]], data: st.DataObject):
    """A chain of calls (each a prompt delta, then an output), read at any stretch: a short stretch comes from the
    pieces that hold it and leaves nothing kept; a long one makes the whole array, kept from then on."""
    line, ids, parent = Line(), [], None
    for i in range(0, len(turns) - 1, 2):
        call = node(i + 1, parent, len(ids), turns[i], turns[i + 1])
        assert line.extend(call)
        ids += turns[i] + turns[i + 1]
        parent = i + 1
    for _ in range(5):
        start = data.draw(st.integers(0, len(ids)))
        stop = data.draw(st.integers(start, len(ids)))
        was_read = line.ids_read
        assert list(line.ids(start, stop)) == ids[start:stop]
        if not was_read and (stop - start) * 4 > len(ids) and start < line._tip_output[0]:
            assert line.ids_read  # a long stretch made (and kept) the whole array
        was_read = line.ids_read
        assert list(line.ids(start, stop, keep=False)) == ids[start:stop]
        assert line.ids_read == was_read  # read from its pieces, nothing kept
    assert len(line) == len(ids)


def test_a_prompt_on_the_line_reads_its_last_turn_without_the_rest():
    line, ids = Line(), []
    opening = list(range(1000, 5000))
    calls = [(opening, [1, 2]), ([3, 4, 5], [6, 7]), ([8, 9], [10])]
    parent = None
    for i, (delta, output) in enumerate(calls):
        call = node(i + 1, parent, len(ids), delta, output)
        assert line.extend(call)
        ids += delta + output
        parent = i + 1
    prompt = call.prompt_on_line()
    assert prompt is not None and len(prompt) == len(ids) - 1
    assert list(prompt[-6:]) == ids[-7:-1] and not line.ids_read  # the last turns, from their pieces
    # A slice reads only the pieces that hold it, however long; nothing is kept.
    assert list(prompt[:3]) == [1000, 1001, 1002] and list(prompt[2:]) == ids[2:-1] and not line.ids_read
    assert list(prompt) == ids[:-1] and line.ids_read  # read whole: the line's array, kept
    assert line.extend(node(4, 3, len(ids), [11], [12])) and list(line.ids(0, len(line))) == [*ids, 11, 12]
