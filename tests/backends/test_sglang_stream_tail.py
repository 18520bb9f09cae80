"""SGLang's cumulative streams are read by their new tail only: each chunk repeats every earlier id and
logprob, and re-checking them all would make a long output quadratic (issue 14)."""

from __future__ import annotations

import pytest

from polar.backends.sglang_wire import OutputReader, latest
from polar.errors import BackendProtocolError
from polar.inference import GenerateRequest


def _chunk(ids: list[int], triples: list) -> dict:
    return {"output_ids": ids, "meta_info": {"output_token_logprobs": triples, "completion_tokens": len(ids)}}


def test_a_cumulative_chunk_is_checked_only_past_what_was_streamed():
    reader = OutputReader("http://sglang", GenerateRequest((1, 2)))
    assert reader.add(_chunk([5, 6], [[-0.1, 5, None], [-0.2, 6, None]])) == ((5, 6), (-0.1, -0.2))
    # The repeated head is not walked again: its (here unreadable) triples are never looked at.
    new = reader.add(_chunk([5, 6, 7], [None, [-0.2, 6, None], [-0.3, 7, None]]))
    assert new == ((7,), (-0.3,))
    assert reader.ids == [5, 6, 7] and reader.logprobs == [-0.1, -0.2, -0.3]


def test_the_new_tail_is_checked_in_full_and_a_rewrite_at_the_seam_is_refused():
    reader = OutputReader("http://sglang", GenerateRequest((1,)))
    reader.add(_chunk([5, 6], [[-0.1, 5, None], [-0.2, 6, None]]))
    with pytest.raises(BackendProtocolError, match=r"output_token_logprobs\[2\] is for token 8"):
        reader.add(_chunk([5, 6, 7], [[-0.1, 5, None], [-0.2, 6, None], [-0.3, 8, None]]))
    with pytest.raises(BackendProtocolError, match="rewrote"):
        reader.add(_chunk([5, 9, 7], [[-0.1, 5, None], [-0.2, 9, None], [-0.3, 7, None]]))
    with pytest.raises(BackendProtocolError, match="not a list of integers"):
        reader.add(_chunk([5, 6, "x"], [[-0.1, 5, None], [-0.2, 6, None], [-0.3, "x", None]]))


def _event(payload: dict) -> str:
    import json

    return json.dumps(payload)


def test_of_cumulative_chunks_that_arrived_together_only_the_last_is_decoded():
    # The earlier events are not even JSON here (past the text that says they are not final): decoding them
    # would raise.
    batch = [
        '{"finish_reason": null, not json',
        '{"finish_reason":null nor this',
        _event(_chunk([5, 6, 7], [[-0.1, 5, None], [-0.2, 6, None], [-0.3, 7, None]])),
    ]
    (only,) = latest(batch, "http://sglang")
    reader = OutputReader("http://sglang", GenerateRequest((1,)))
    assert reader.add(only) == ((5, 6, 7), (-0.1, -0.2, -0.3))


def test_incremental_chunks_that_arrived_together_are_all_decoded_in_order():
    def increment(ids: list[int], total: int) -> str:
        return _event(
            {
                "output_ids": ids,
                "meta_info": {"output_token_logprobs": [[-0.5, i, None] for i in ids], "completion_tokens": total},
            }
        )

    batch = [increment([5], 1), increment([6], 2), increment([7, 8], 4)]
    reader = OutputReader("http://sglang", GenerateRequest((1,)))
    for payload in latest(batch, "http://sglang"):
        reader.add(payload)
    assert reader.ids == [5, 6, 7, 8]


def test_an_error_event_is_never_skipped():
    batch = [_event(_chunk([5], [[-0.1, 5, None]])), _event({"error": {"message": "boom", "code": 500}})]
    assert [p.get("error") for p in latest(batch, "http://sglang")] == [None, {"message": "boom", "code": 500}]


def test_an_event_that_is_no_object_or_a_final_chunk_before_others_is_never_skipped():
    last = _event(_chunk([5, 6], [[-0.1, 5, None], [-0.2, 6, None]]))
    for stray in ("null", "5", '"text"', "[1]"):
        with pytest.raises(BackendProtocolError, match="not a JSON object"):
            latest([stray, last], "http://sglang")
    final = _chunk([5], [[-0.1, 5, None]])
    final["meta_info"]["finish_reason"] = {"type": "length", "length": 1}
    assert len(latest([_event(final), last], "http://sglang")) == 2  # decoded: the reader refuses what follows
