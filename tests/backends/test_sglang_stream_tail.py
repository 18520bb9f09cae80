"""SGLang's cumulative streams are read by their new tail only: each chunk repeats every earlier id and
logprob, and re-checking them all would make a long output quadratic (issue 14)."""

from __future__ import annotations

import pytest

from polar.backends.base import GenerateRequest
from polar.backends.sglang_wire import OutputReader
from polar.errors import BackendProtocolError


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
