"""``polar serve-model`` over the tiny MoE model: top-k logprobs, chosen-id logprobs and routed experts in SGLang's
wire format, checked against one uncached pass of the model over the whole sequence."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from polar.inference import LogprobSemantics
from polar.model_folder import folder_tokenizer, open_model_folder
from polar.models.engine import LocalEngine
from polar.models.moe import logprob_rows, routing_of
from polar.models.tiny import ensure_model_dir
from polar.serving.sglang_app import create_app
from polar.serving.threaded import ServerThread
from tests.serving.test_sglang_server import error_of, generate, stream

PARAMS = {"max_new_tokens": 8, "temperature": 0.7, "sampling_seed": 11}
PROMPT = list(range(300, 340))


@pytest.fixture(scope="module")
def moe_engine(cache_dir: Path) -> Iterator[LocalEngine]:
    folder = open_model_folder(ensure_model_dir("tiny-moe", cache_dir))
    engine = LocalEngine(folder.path, folder_tokenizer(folder))
    yield engine
    engine.close()


def _server(engine: LocalEngine, **kw) -> Iterator[httpx.Client]:
    with ServerThread(create_app(engine, served_model_name="tiny-moe", **kw)) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            yield client


@pytest.fixture(scope="module")
def client(moe_engine: LocalEngine) -> Iterator[httpx.Client]:
    yield from _server(moe_engine, enable_return_routed_experts=True)


@pytest.fixture(scope="module")
def incremental(moe_engine: LocalEngine) -> Iterator[httpx.Client]:
    yield from _server(moe_engine, enable_return_routed_experts=True, incremental_streaming=True)


def _experts(meta: dict, rows: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype="<i4").reshape(rows, 2, 2)


def _reference(engine: LocalEngine, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    return logprob_rows(logits, PARAMS["temperature"], LogprobSemantics.TEMPERATURE_SCALED, greedy=False)


def test_top_logprobs_chosen_ids_and_experts_equal_a_whole_sequence_pass(client, moe_engine):
    body = generate(
        client,
        input_ids=PROMPT,
        sampling_params=PARAMS,
        return_logprob=True,
        top_logprobs_num=3,
        token_ids_logprob=[7, 5],
        return_routed_experts=True,
        routed_experts_start_len=10,
    )
    meta, out = body["meta_info"], body["output_ids"]
    ids = PROMPT + out
    reference = _reference(moe_engine, ids)
    top = meta["output_top_logprobs"]
    assert len(top) == len(out) and all(len(row) == 3 for row in top)
    for i, row in enumerate(top):
        expected = torch.topk(reference[len(PROMPT) - 1 + i], 3)
        assert [t[1] for t in row] == expected.indices.tolist() and all(t[2] is None for t in row)
        assert np.allclose([t[0] for t in row], expected.values.numpy(), atol=1e-5)
        sampled = meta["output_token_logprobs"][i][0]
        assert sampled <= row[0][0] + 1e-6  # the most likely id first
    chosen = meta["output_token_ids_logprobs"]
    assert [[t[1] for t in row] for row in chosen] == [[7, 5]] * len(out)
    assert np.allclose([row[0][0] for row in chosen], reference[len(PROMPT) - 1 : -1, 7].numpy(), atol=1e-5)
    # Positions [10, prompt + output - 1): the last sampled id was never fed.
    assert moe_engine.router_tap is not None
    expected_experts = routing_of(moe_engine.model, ids, moe_engine.router_tap.shape)
    assert np.array_equal(_experts(meta, len(ids) - 1 - 10), expected_experts[10:-1])


def test_streams_carry_top_logprobs_per_chunk_and_experts_at_the_end(client, incremental):
    ask = dict(
        input_ids=PROMPT, sampling_params=PARAMS, return_logprob=True, top_logprobs_num=2, return_routed_experts=True
    )
    whole = generate(client, **ask)["meta_info"]
    chunks = stream(client, **ask)
    assert all(len(c["meta_info"]["output_top_logprobs"]) == len(c["output_ids"]) for c in chunks)
    assert [("routed_experts" in c["meta_info"]) for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1]["meta_info"]["output_top_logprobs"] == whole["output_top_logprobs"]
    assert chunks[-1]["meta_info"]["routed_experts"] == whole["routed_experts"]
    deltas = stream(incremental, **ask)
    joined = [row for c in deltas for row in c["meta_info"]["output_top_logprobs"]]
    assert (
        joined == whole["output_top_logprobs"] and deltas[-1]["meta_info"]["routed_experts"] == whole["routed_experts"]
    )


def test_extras_follow_sglang_rules(client, moe_engine, engine):
    # Top-k only with return_logprob, as in SGLang.
    meta = generate(client, input_ids=PROMPT, sampling_params=PARAMS, top_logprobs_num=2)["meta_info"]
    assert "output_top_logprobs" not in meta
    assert "routed_experts_start_len" in error_of(
        client.post(
            "/generate", json={"input_ids": PROMPT, "return_routed_experts": True, "routed_experts_start_len": 99}
        )
    )
    # Without --enable-return-routed-experts the flag is silently ignored, as SGLang does.
    for plain in _server(moe_engine):
        meta = generate(plain, input_ids=PROMPT, sampling_params=PARAMS, return_routed_experts=True)["meta_info"]
        assert "routed_experts" not in meta
    # A dense model has no experts to report.
    for dense in _server(engine, enable_return_routed_experts=True):
        message = error_of(dense.post("/generate", json={"input_ids": PROMPT, "return_routed_experts": True}))
        assert "mixture-of-experts" in message
