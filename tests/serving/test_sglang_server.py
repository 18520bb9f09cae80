"""The SGLang-shaped server over real HTTP: response shapes, stops, streaming modes, errors, disconnects."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
import pytest

from polar.inference import FinishReason, GenerateRequest, SamplingParams, collect
from polar.serving.sglang_wire import BATCH_NOT_SUPPORTED

META_KEYS = {
    "id",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "weight_version",
    "weight_versions",
    "e2e_latency",
}
LOGPROB_KEYS = {"output_token_logprobs", "output_token_logprobs_length"}
# With the chat prompt at T=1 the seeded tiny model samples <|im_end|> early under these seeds (found by
# scanning); _im_end_seed falls back to a scan if a different torch ever draws differently.
KNOWN_IM_END_SEEDS = (178, 221)


def generate(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def stream(client: httpx.Client, **body: Any) -> list[dict[str, Any]]:
    with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [json.loads(e[len("data: ") :]) for e in events[:-1]]


def error_of(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"} and error["code"] == status
    return error["message"]


def assert_shape(body: dict[str, Any], *, logprobs: bool = True) -> None:
    assert set(body) == {"text", "output_ids", "meta_info"}
    meta = body["meta_info"]
    assert set(meta) == META_KEYS | (LOGPROB_KEYS if logprobs else set())
    assert isinstance(body["text"], str) and all(isinstance(i, int) for i in body["output_ids"])
    assert meta["weight_version"] == meta["weight_versions"][-1]["version"]
    if logprobs:
        triples = meta["output_token_logprobs"]
        assert len(triples) == len(body["output_ids"])
        assert [tid for _, tid, _ in triples] == body["output_ids"]
        assert all(isinstance(lp, float) for lp, _, _ in triples)


def _im_end_seed(engine, prompt: list[int]) -> int:
    async def stops_on_im_end(seed: int) -> bool:
        request = GenerateRequest(tuple(prompt), SamplingParams(max_new_tokens=48, temperature=1.0, seed=seed))
        result = await collect(engine.stream(request))
        return result.finish_reason is FinishReason.STOP and result.matched_stop == engine.tokenizer.im_end_id

    async def find() -> int:
        for seed in (*KNOWN_IM_END_SEEDS, *range(1000)):
            if await stops_on_im_end(seed):
                return seed
        raise AssertionError("no seed in 0..999 makes the tiny model sample <|im_end|>")

    return asyncio.run(find())


# §1 non-streaming shape -------------------------------------------------------------------------------


def test_response_has_sglang_fields_and_echoes_rid(served, chat_prompt):
    with served.client() as client:
        body = generate(
            client,
            input_ids=chat_prompt,
            sampling_params={"max_new_tokens": 6, "temperature": 0},
            return_logprob=True,
            rid="req-echo",
            some_future_field={"ignored": True},  # unknown top-level keys are ignored, as in SGLang
        )
    assert_shape(body)
    meta = body["meta_info"]
    assert meta["id"] == "req-echo"
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == len(chat_prompt) and meta["completion_tokens"] == 6
    assert meta["output_token_logprobs_length"] == 6
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 6}]
    assert all(text is None for _, _, text in meta["output_token_logprobs"])  # return_text_in_logprobs=False
    assert meta["e2e_latency"] > 0


def test_text_prompt_token_ids_and_logprob_texts(served, small_tokenizer):
    with served.client() as client:
        body = client.put(
            "/generate",
            json={
                "text": "def main():",
                "sampling_params": {"max_new_tokens": 4, "temperature": 0},
                "return_logprob": True,
                "return_text_in_logprobs": True,
                "return_prompt_token_ids": True,
            },
        ).json()
        plain = generate(client, text="def main():", sampling_params={"max_new_tokens": 4, "temperature": 0})
    prompt = small_tokenizer.encode("def main():")
    assert body["prompt_token_ids"] == prompt and body["meta_info"]["prompt_tokens"] == len(prompt)
    assert [t for _, _, t in body["meta_info"]["output_token_logprobs"]] == [
        small_tokenizer.decode([i]) for i in body["output_ids"]
    ]
    assert_shape(plain, logprobs=False)
    assert plain["output_ids"] == body["output_ids"]


def test_max_new_tokens_defaults_to_128(served):
    with served.client() as client:
        body = generate(client, input_ids=[5, 6, 7], sampling_params={"temperature": 0, "ignore_eos": True})
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 128}
    assert len(body["output_ids"]) == 128


# §2 stops -----------------------------------------------------------------------------------------------


def test_eos_stop_keeps_token_in_ids_and_trims_text(served, engine, chat_prompt, small_tokenizer):
    seed = _im_end_seed(engine, chat_prompt)
    im_end = small_tokenizer.im_end_id
    request = {"max_new_tokens": 48, "temperature": 1.0, "sampling_seed": seed}
    with served.client() as client:
        body = generate(client, input_ids=chat_prompt, sampling_params=request, return_logprob=True)
        raw = generate(client, input_ids=chat_prompt, sampling_params={**request, "skip_special_tokens": False})
        untrimmed = generate(
            client,
            input_ids=chat_prompt,
            sampling_params={**request, "skip_special_tokens": False, "no_stop_trim": True},
        )
    assert_shape(body)
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": im_end}
    assert body["output_ids"][-1] == im_end
    assert body["meta_info"]["output_token_logprobs"][-1][1] == im_end  # the stop token has a logprob
    assert "<|im_end|>" not in body["text"] and "<|im_end|>" not in raw["text"]
    assert raw["text"] == small_tokenizer.decode(raw["output_ids"][:-1])
    assert untrimmed["text"].endswith("<|im_end|>")


def test_stop_token_ids_match_a_sampled_token(served, chat_prompt, small_tokenizer):
    with served.client() as client:
        greedy = generate(client, input_ids=chat_prompt, sampling_params={"max_new_tokens": 8, "temperature": 0})
        target = greedy["output_ids"][3]
        first = greedy["output_ids"].index(target)
        body = generate(
            client,
            input_ids=chat_prompt,
            sampling_params={"max_new_tokens": 8, "temperature": 0, "stop_token_ids": [target]},
        )
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
    assert body["output_ids"] == greedy["output_ids"][: first + 1]
    assert body["text"] == small_tokenizer.decode(greedy["output_ids"][:first], skip_special_tokens=True)


def test_stop_string_cuts_ids_after_completing_token_and_trims_text(served, chat_prompt, small_tokenizer):
    with served.client() as client:
        greedy = generate(client, input_ids=chat_prompt, sampling_params={"max_new_tokens": 12, "temperature": 0})
        ids = greedy["output_ids"]
        # A stop string inside the 6th token's text that the first five tokens do not already contain.
        k = 5
        stop = small_tokenizer.decode([ids[k]]).strip()[:3]
        assert stop and "\ufffd" not in stop and stop not in small_tokenizer.decode(ids[:k])
        body = generate(
            client,
            input_ids=chat_prompt,
            sampling_params={"max_new_tokens": 12, "temperature": 0, "stop": [stop]},
            return_logprob=True,
        )
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert body["output_ids"] == ids[: k + 1]
    full = small_tokenizer.decode(ids[: k + 1], skip_special_tokens=True)
    assert body["text"] == full[: full.find(stop)] and stop not in body["text"]
    assert len(body["meta_info"]["output_token_logprobs"]) == k + 1


# §3 streaming ---------------------------------------------------------------------------------------------


def test_cumulative_stream_chunks_grow_and_end_like_the_response(served, chat_prompt):
    params = {"max_new_tokens": 10, "temperature": 0.7, "sampling_seed": 11}
    with served.client() as client:
        whole = generate(client, input_ids=chat_prompt, sampling_params=params, return_logprob=True)
        chunks = stream(client, input_ids=chat_prompt, sampling_params=params, return_logprob=True, rid="s-1")
    assert len(chunks) == 10  # one per token; the last token arrives with the finish reason
    for n, chunk in enumerate(chunks, start=1):
        assert_shape(chunk)
        meta = chunk["meta_info"]
        assert meta["id"] == "s-1" and meta["completion_tokens"] == n == len(chunk["output_ids"])
        assert chunk["output_ids"] == whole["output_ids"][:n]
        assert meta["output_token_logprobs"] == whole["meta_info"]["output_token_logprobs"][:n]
        assert (meta["finish_reason"] is None) == (n < 10)
    last = chunks[-1]
    assert last["text"] == whole["text"] and last["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert last["meta_info"]["weight_versions"] == whole["meta_info"]["weight_versions"]


def test_incremental_stream_chunks_are_deltas(served_incremental, chat_prompt):
    params = {"max_new_tokens": 10, "temperature": 0.7, "sampling_seed": 11}
    with served_incremental.client() as client:
        whole = generate(client, input_ids=chat_prompt, sampling_params=params, return_logprob=True)
        chunks = stream(client, input_ids=chat_prompt, sampling_params=params, return_logprob=True)
    assert [len(c["output_ids"]) for c in chunks] == [1] * 10
    assert [i for c in chunks for i in c["output_ids"]] == whole["output_ids"]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    triples = [t for c in chunks for t in c["meta_info"]["output_token_logprobs"]]
    assert triples == whole["meta_info"]["output_token_logprobs"]
    for n, chunk in enumerate(chunks, start=1):
        assert_shape(chunk)
        assert chunk["meta_info"]["completion_tokens"] == n == chunk["meta_info"]["output_token_logprobs_length"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 10}


def test_stream_interval_groups_tokens(served, chat_prompt):
    params = {"max_new_tokens": 7, "temperature": 0, "stream_interval": 3}
    with served.client() as client:
        chunks = stream(client, input_ids=chat_prompt, sampling_params=params)
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [3, 6, 7]


# §4 errors -------------------------------------------------------------------------------------------------


def test_bad_requests_get_400_naming_the_problem(served, chat_prompt):
    with served.client() as client:
        post = lambda **body: client.post("/generate", json=body)  # noqa: E731
        assert "'max_tokens'" in error_of(post(input_ids=chat_prompt, sampling_params={"max_tokens": 4}))
        assert "'seed'" in error_of(post(input_ids=chat_prompt, sampling_params={"seed": 4}))  # SGLang: sampling_seed
        assert "exactly one of" in error_of(post(input_ids=chat_prompt, text="hi"))
        assert "exactly one of" in error_of(post(sampling_params={}))
        assert "temperature" in error_of(post(input_ids=chat_prompt, sampling_params={"temperature": -1}))
        assert error_of(post(input_ids=[chat_prompt, chat_prompt])) == BATCH_NOT_SUPPORTED
        assert error_of(post(text=["a", "b"])) == BATCH_NOT_SUPPORTED
        assert error_of(post(input_ids=chat_prompt, sampling_params={"n": 2})) == BATCH_NOT_SUPPORTED
        assert "frequency_penalty" in error_of(post(input_ids=chat_prompt, sampling_params={"frequency_penalty": 0.5}))
        assert "vocabulary" in error_of(post(input_ids=[10**6]))
        assert "not valid JSON" in error_of(client.post("/generate", content=b"{nope"))
        neutral = post(input_ids=chat_prompt, sampling_params={"max_new_tokens": 1, "repetition_penalty": 1.0})
        assert neutral.status_code == 200


def test_context_overflow_is_400_naming_the_context_length(served, engine):
    window = engine.context_length
    with served.client() as client:
        too_long = client.post("/generate", json={"input_ids": [5] * window})
        message = error_of(too_long)
        assert f"context length ({window} tokens)" in message
        assert too_long.json()["error"]["type"] == "context_length_exceeded"
        total = client.post(
            "/generate", json={"input_ids": [5] * (window - 10), "sampling_params": {"max_new_tokens": 10}}
        )
        assert f"maximum context length of {window} tokens" in error_of(total)


# §5 disconnects and aborts ---------------------------------------------------------------------------------


def _wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_stream_disconnect_stops_the_generation(served, chat_prompt):
    served_before = served.engine.requests_served
    body = {"input_ids": chat_prompt, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}, "stream": True}
    with served.client() as client, client.stream("POST", "/generate", json={**body, "rid": "gone"}) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert "gone" in served.app.state.sglang.runs
        duplicate = client.post("/generate", json={"input_ids": chat_prompt, "rid": "gone"})
        assert "already in flight" in error_of(duplicate)
        assert client.post("/flush_cache").status_code == 400  # SGLang refuses while requests run
    # The connection is closed: the run and the engine job go away (white-box: no running jobs left).
    assert _wait_until(lambda: not served.app.state.sglang.runs and not served.engine._jobs)
    assert served.engine.requests_served == served_before  # it never finished


def test_non_stream_disconnect_stops_the_generation(served, chat_prompt):
    body = json.dumps(
        {"input_ids": chat_prompt, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}, "rid": "left"}
    ).encode()
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert _wait_until(lambda: "left" in served.app.state.sglang.runs)
    assert _wait_until(lambda: not served.app.state.sglang.runs and not served.engine._jobs)


def test_abort_request_by_rid_ends_with_abort_and_partial_output(served, chat_prompt):
    body = {
        "input_ids": chat_prompt,
        "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
        "return_logprob": True,
        "stream": True,
        "rid": "victim",
    }
    with served.client() as client:
        chunks = []
        with client.stream("POST", "/generate", json=body) as response:
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunks.append(json.loads(line[6:]))
                if len(chunks) == 3:
                    assert client.post("/abort_request", json={"rid": "victim"}).status_code == 200
    last = chunks[-1]
    finish = last["meta_info"]["finish_reason"]
    assert finish["type"] == "abort" and set(finish) == {"type", "message", "status_code", "err_type"}
    assert 3 <= len(last["output_ids"]) < 2000
    assert len(last["meta_info"]["output_token_logprobs"]) == len(last["output_ids"])


# §6 the other endpoints ----------------------------------------------------------------------------------------


def test_info_health_models_tokenize(served, engine, small_tokenizer):
    with served.client() as client:
        info = client.get("/model_info").json()
        assert info["served_model_name"] == "tiny" and info["is_generation"] is True
        assert info["weight_version"] == engine.weight_version
        assert info["model_path"] == str(engine.model_dir) and info["tokenizer_path"]
        assert info["architectures"] == ["Qwen3ForCausalLM"] and info["model_type"] == "qwen3"
        assert info["max_context_length"] == engine.context_length
        assert client.get("/health").status_code == 200
        assert client.get("/health_generate").status_code == 200
        models = client.get("/v1/models").json()
        assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
        assert models["data"][0]["max_model_len"] == engine.context_length
        tokens = client.post("/tokenize", json={"prompt": "hello <|im_end|>"}).json()
        assert tokens == {
            "tokens": small_tokenizer.encode("hello <|im_end|>"),
            "count": len(small_tokenizer.encode("hello <|im_end|>")),
            "max_model_len": engine.context_length,
        }
        text = client.post("/detokenize", json={"tokens": tokens["tokens"]}).json()
        assert text == {"text": "hello "}
        raw = client.post("/detokenize", json={"tokens": tokens["tokens"], "skip_special_tokens": False}).json()
        assert raw == {"text": "hello <|im_end|>"}
        assert "at prompt:" in error_of(client.post("/tokenize", json={"text": "x"}))


def test_responses_satisfy_sglang_contract(served, served_incremental, chat_prompt):
    api_types = pytest.importorskip(
        "sglang.api.v1.api_types", reason="the sglang package (its api/v1 contract types) is not installed"
    )
    params = {"max_new_tokens": 5, "temperature": 0.7, "sampling_seed": 3}
    with served.client() as client, served_incremental.client() as inc:
        bodies = [generate(client, input_ids=chat_prompt, sampling_params=params, return_logprob=True)]
        bodies += stream(client, input_ids=chat_prompt, sampling_params=params, return_logprob=True)
        bodies += stream(inc, input_ids=chat_prompt, sampling_params=params, return_logprob=True)
        bodies.append(generate(client, input_ids=chat_prompt, sampling_params={"max_new_tokens": 2}))
    for body in bodies:
        api_types.GenerateResponse.from_json_value(body)


def test_flush_cache_drops_the_engines_prefix_cache(served):
    body = {"input_ids": list(range(100, 160)), "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    cache = served.engine.prefix_cache
    with served.client() as client:
        generate(client, **body)
        hits = cache.hits
        generate(client, **body)  # the same prompt again reuses the first request's cache
        assert cache.hits == hits + 1
        assert client.get("/flush_cache").status_code == 200
        generate(client, **body)
        assert cache.hits == hits + 1
