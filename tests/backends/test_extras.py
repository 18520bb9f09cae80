"""Reading SGLang's extras strictly: a body's routed experts cut out before parsing, and every way a server (or a
router between) can leave them out or get them wrong is a clear error naming it, never a capture without them."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from polar.backends.extras import ExtrasReader, loads_without_experts, sglang_request_fields
from polar.errors import BackendProtocolError, ConfigError
from polar.inference import ExtrasRequest, GenerateRequest
from polar.models.moe_shape import MoEShape

SHAPE = MoEShape(layers=2, top_k=2, num_experts=8)


def _b64(rows: int, value: int = 3) -> str:
    return base64.b64encode(np.full((rows, 2, 2), value, "<i4").tobytes()).decode()


def test_request_fields_are_sglangs():
    asked = ExtrasRequest(top_logprobs=4, routed_experts=True, routed_experts_start=7, token_ids=(1, 2))
    assert sglang_request_fields(asked) == {
        "top_logprobs_num": 4,
        "token_ids_logprob": [1, 2],
        "return_routed_experts": True,
        "routed_experts_start_len": 7,
    }
    assert sglang_request_fields(None) == {} == sglang_request_fields(ExtrasRequest())


@pytest.mark.parametrize("last", [True, False])
def test_a_body_parses_the_same_with_the_experts_cut_out(last: bool):
    meta = {"prompt_tokens": 3, "routed_experts": _b64(4)} if last else {"routed_experts": _b64(4), "prompt_tokens": 3}
    body = orjson.dumps({"output_ids": [1, 2], "meta_info": meta})
    payload = loads_without_experts(body)
    assert payload["meta_info"]["prompt_tokens"] == 3
    assert base64.b64decode(payload["meta_info"]["routed_experts"]) == base64.b64decode(meta["routed_experts"])
    assert loads_without_experts(b'{"output_ids": [1]}') == {"output_ids": [1]}


def _payload(ids: list[int], **meta) -> dict:
    return {"output_ids": ids, "meta_info": meta}


def test_missing_or_malformed_extras_are_named():
    request = GenerateRequest((1, 2, 3), extras=ExtrasRequest(top_logprobs=2, routed_experts=True))
    reader = ExtrasReader("http://s/generate", request, SHAPE)
    top = [[[-0.1, 5, None], [-0.2, 6, None]], [[-0.1, 7, None], [-0.3, 8, None]]]
    reader.add(_payload([5, 7], output_top_logprobs=top), 2)
    with pytest.raises(BackendProtocolError, match="--enable-return-routed-experts"):
        reader.result(_payload([5, 7]), 2)
    with pytest.raises(BackendProtocolError, match="not 4 positions"):
        reader.result(_payload([5, 7], routed_experts=_b64(3)), 2)
    with pytest.raises(BackendProtocolError, match="outside"):
        reader.result(_payload([5, 7], routed_experts=_b64(4, value=9)), 2)
    extras = reader.result(_payload([5, 7], routed_experts=_b64(4)), 2)
    assert extras.routed_experts.shape == (4, 2, 2) and extras.routed_experts.dtype == np.uint8
    assert extras.top_ids.tolist() == [[5, 6], [7, 8]]
    with pytest.raises(BackendProtocolError, match="output_top_logprobs"):
        ExtrasReader("u", request, SHAPE).add(_payload([5]), 1)
    with pytest.raises(ConfigError, match="no MoE layers"):
        ExtrasReader("u", request, None).result(_payload([], routed_experts=_b64(2)), 0)
