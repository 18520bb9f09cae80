"""A session's line holds a chain's ids once; calls that do not continue it exactly keep their own, and every
call's ids read the same either way."""

from __future__ import annotations

from array import array

from polar.proxy.session.call_node import CallNode, Line
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
    assert list(line.ids) == [1, 2, 3, 4, 5, 6, 7] and line.tip == 2
    assert (list(root.prompt_delta_ids), list(root.output_ids)) == ([1, 2, 3], [4, 5])
    assert (list(child.prompt_delta_ids), list(child.output_ids)) == ([6], [7])
    assert list(child.prompt_on_line() or []) == [1, 2, 3, 4, 5, 6]


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
    assert list(line.ids) == [1, 2, 3, 5, 6]
