"""The sglang backend client against polar's SGLang-shaped server, over real HTTP.

Logprobs are checked against an independent teacher-forced rescore of the same model; weight updates
land in the middle of a streamed generation and must show up as version spans.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from array import array
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
import torch
from safetensors.torch import save_file

from polar.backends.sglang import IDS_SLICE, SGLangBackend, _body_json, _ids_json, _json
from polar.errors import ContextLengthExceeded, InvalidRequest, UnknownSamplingParameter
from polar.inference import (
    Backend,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    LogprobSemantics,
    SamplingParams,
    VersionSpan,
    WeightUpdate,
    collect,
)
from polar.models.engine import LocalEngine
from polar.models.sampling import rescore
from polar.serving.sglang_app import create_app
from polar.serving.threaded import ServerThread
from polar.tokens.ids_json import ids_text, json_array

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def cumulative_url(engine: LocalEngine) -> Iterator[str]:
    with ServerThread(create_app(engine, served_model_name="tiny")) as server:
        yield server.url


@pytest.fixture(scope="module")
def incremental_url(engine: LocalEngine) -> Iterator[str]:
    with ServerThread(create_app(engine, served_model_name="tiny", incremental_streaming=True)) as server:
        yield server.url


@pytest.fixture(scope="module")
def weights_engine(tiny_model_dir: Path, small_tokenizer) -> Iterator[LocalEngine]:
    """An engine whose weights, labels and pause state the tests below change."""
    eng = LocalEngine(tiny_model_dir, small_tokenizer)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def weights_url(weights_engine: LocalEngine) -> Iterator[str]:
    with ServerThread(create_app(weights_engine, served_model_name="tiny")) as server:
        yield server.url


@pytest.fixture
async def client(cumulative_url: str) -> AsyncIterator[SGLangBackend]:
    backend = await SGLangBackend.connect(cumulative_url)
    yield backend
    await backend.aclose()


@pytest.fixture
async def weights_client(weights_url: str) -> AsyncIterator[SGLangBackend]:
    backend = await SGLangBackend.connect(weights_url)
    yield backend
    await backend.aclose()


@pytest.fixture(scope="module")
def prompt(small_tokenizer) -> tuple[int, ...]:
    return tuple(small_tokenizer.encode("<|im_start|>user\nWrite a loop.<|im_end|>\n<|im_start|>assistant\n"))


def assert_matches_rescore(model, prompt: tuple[int, ...], result: GenerateResult, temperature: float) -> None:
    ids = list(prompt) + list(result.output_ids)
    expected = rescore(model, ids, len(prompt), temperature, LogprobSemantics.TEMPERATURE_SCALED)
    assert len(expected) == len(result.output_logprobs)
    assert max(abs(a - b) for a, b in zip(expected, result.output_logprobs, strict=True)) < TOLERANCE


def same_output(a: GenerateResult, b: GenerateResult) -> bool:
    timing = {"ttft_s": None, "e2e_s": None}
    return replace(a, **timing) == replace(b, **timing)


# §1 generation and logprobs ----------------------------------------------------------------------------------


async def test_connect_reads_model_info(client: SGLangBackend, engine: LocalEngine):
    assert isinstance(client, Backend)
    assert client.name == "sglang"
    assert client.context_length == engine.context_length
    assert await client.weight_version() == engine.weight_version


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (0.7, 1234)], ids=["greedy", "sampled"])
async def test_logprobs_match_a_teacher_forced_rescore(client, engine, prompt, temperature, seed):
    params = SamplingParams(max_new_tokens=24, temperature=temperature, seed=seed, ignore_eos=True)
    result = await client.generate(GenerateRequest(prompt, params))
    assert result.finish_reason is FinishReason.LENGTH and len(result.output_ids) == 24
    assert result.prompt_tokens == len(prompt)
    assert result.logprob_semantics is LogprobSemantics.TEMPERATURE_SCALED
    assert result.version_spans == (VersionSpan(engine.weight_version, 0, 24),)
    assert result.e2e_s is not None and result.e2e_s > 0
    assert_matches_rescore(engine.model, prompt, result, temperature)


async def test_stream_gives_the_same_result_as_generate(client, prompt):
    request = GenerateRequest(prompt, SamplingParams(max_new_tokens=16, temperature=0.8, seed=99), "same-seed")
    whole = await client.generate(request)
    chunks = [chunk async for chunk in client.stream(request)]
    streamed = chunks[-1].final
    assert streamed is not None and all(c.final is None for c in chunks[:-1])
    assert same_output(whole, streamed)
    assert tuple(i for c in chunks for i in c.output_ids) == whole.output_ids
    assert tuple(lp for c in chunks for lp in c.output_logprobs) == whole.output_logprobs
    assert streamed.ttft_s is not None and whole.ttft_s is None


async def test_an_int32_array_prompt_is_sent_as_the_same_ids(client, prompt):
    """A long append-mode prompt comes as an int32 array (encoded through numpy): the server sees the same ids."""
    request = GenerateRequest(prompt, SamplingParams(max_new_tokens=8, temperature=0.0))
    as_array = replace(request, input_ids=array("i", prompt))
    assert same_output(await client.generate(request), await client.generate(as_array))
    chunks = [chunk async for chunk in client.stream(as_array)]
    assert chunks[-1].final is not None and chunks[-1].final.prompt_tokens == len(prompt)


def test_a_request_body_holds_only_its_bytes():
    """A body is held for as long as its call runs (a thousand at once on a loaded gateway): orjson's bytes keep
    the whole buffer they were written in (1 MB for the 19 KB of a 4,000-id prompt), the body sent must not."""
    payload = {"input_ids": _ids_json(array("i", range(4000))), "sampling_params": {"max_new_tokens": 8}}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        body = _json(payload)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert orjson.loads(body)["input_ids"] == list(range(4000))
    assert held < 1.1 * len(body) + 1024


def _reachable(root: object, depth: int) -> dict[int, object]:
    """What ``root`` reaches in ``depth`` steps, by id."""
    seen, layer = {id(root): root}, [root]
    for _ in range(depth):
        layer = [o for parent in layer for o in gc.get_referents(parent) if id(o) not in seen]
        seen.update((id(o), o) for o in layer)
    return seen


async def test_a_stream_holds_no_parsed_event_while_its_consumer_works(client, prompt):
    """Between chunks a stream keeps what it has read as ids and logprobs only: a cumulative event parses into a
    list per logprob triple, and a thousand open streams holding their latest one slowed every young collection.
    (The server runs in this process and holds its own chunk: only what the client's stream reaches counts.)"""
    request = GenerateRequest(prompt, SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True))
    stream = client.stream(request)
    chunks = 0
    async for _ in stream:
        chunks += 1
        events = [o for o in gc.get_objects() if type(o) is dict and "meta_info" in o and "output_ids" in o]
        held = _reachable(stream, 4)
        assert not [e for e in events if id(e) in held]
    assert chunks >= 2


async def test_a_stream_holds_no_request_body_once_it_is_sent(client, prompt):
    """The JSON sent (thousands of prompt ids: 14 KB for a 20-message agent call) is not held while the reply
    streams: a thousand streams in flight held 14 MB of bodies already sent."""
    request = GenerateRequest(prompt, SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True))
    stream = client.stream(request)
    chunks = 0
    async for _ in stream:
        chunks += 1
        held = [o for o in _reachable(stream, 8).values() if isinstance(o, bytes) and b'"input_ids"' in o]
        assert not held
    assert chunks >= 2


async def test_cumulative_and_incremental_servers_agree(cumulative_url, incremental_url, prompt):
    request = GenerateRequest(prompt, SamplingParams(max_new_tokens=12, temperature=0.9, seed=5))
    results = []
    for url in (cumulative_url, incremental_url):
        backend = await SGLangBackend.connect(url)
        try:
            results.append(await collect(backend.stream(request)))
            results.append(await backend.generate(request))
        finally:
            await backend.aclose()
    assert all(same_output(results[0], other) for other in results[1:])


async def test_stop_token_is_the_last_output_id(client, prompt):
    greedy = await client.generate(GenerateRequest(prompt, SamplingParams(max_new_tokens=8, temperature=0)))
    target = greedy.output_ids[4]
    first = greedy.output_ids.index(target)
    params = SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=(target,))
    stopped = await collect(client.stream(GenerateRequest(prompt, params)))
    assert stopped.finish_reason is FinishReason.STOP and stopped.matched_stop == target
    assert stopped.output_ids == greedy.output_ids[: first + 1]
    assert stopped.output_logprobs == greedy.output_logprobs[: first + 1]


# §2 errors carrying the server's message -------------------------------------------------------------------


async def test_unknown_sampling_key_is_rejected_with_the_servers_message(cumulative_url, prompt):
    backend = await SGLangBackend.connect(cumulative_url, extra_sampling_params={"max_tokens": 4})
    try:
        for call in (backend.generate, lambda r: collect(backend.stream(r))):
            with pytest.raises(UnknownSamplingParameter) as info:
                await call(GenerateRequest(prompt, SamplingParams(max_new_tokens=2)))
            assert "unknown sampling parameter 'max_tokens'" in info.value.message
            assert info.value.field == "sampling_params.max_tokens"
    finally:
        await backend.aclose()


async def test_context_overflow_is_context_length_exceeded(client, engine):
    window = engine.context_length
    with pytest.raises(ContextLengthExceeded) as info:
        await client.generate(GenerateRequest((5,) * window, SamplingParams(max_new_tokens=1)))
    assert f"context length ({window} tokens)" in info.value.message  # the server's own words
    assert info.value.context_length == window and info.value.prompt_tokens == window
    with pytest.raises(ContextLengthExceeded):
        await collect(client.stream(GenerateRequest((5,) * (window - 4), SamplingParams(max_new_tokens=8))))


# §3 weights, versions and pauses ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def perturbed_weights(engine: LocalEngine, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's weights plus seeded noise, saved as a checkpoint folder."""
    folder = tmp_path_factory.mktemp("perturbed")
    noise = torch.Generator().manual_seed(7)
    state = {
        k: (v + 0.01 * torch.randn(v.shape, generator=noise)).contiguous() for k, v in engine.model.state_dict().items()
    }
    save_file(state, folder / "model.safetensors")
    return folder


async def test_weight_update_mid_stream_splits_the_version_spans(
    weights_client, weights_engine, engine, perturbed_weights, prompt
):
    old = await weights_client.weight_version()
    request = GenerateRequest(prompt, SamplingParams(max_new_tokens=400, ignore_eos=True, temperature=0))
    seen = 0
    updated = False
    final = None
    async for chunk in weights_client.stream(request):
        seen += len(chunk.output_ids)
        if seen >= 20 and not updated:
            reply = await weights_client.update_weights_from_disk(perturbed_weights, "v1")
            assert reply["success"] is True
            updated = True
        final = chunk.final or final
    assert final is not None and len(final.output_ids) == 400
    first, second = final.version_spans
    assert (first.version, second.version) == (old, "v1")
    assert first.start == 0 and 20 <= first.end == second.start < 400 and second.end == 400
    # Tokens before the update were sampled by the old weights (the session engine still has them).
    head = replace(final, output_ids=final.output_ids[: first.end], output_logprobs=final.output_logprobs[: first.end])
    assert_matches_rescore(engine.model, prompt, head, 0.0)

    assert await weights_client.weight_version() == "v1"
    after = await weights_client.generate(
        GenerateRequest(prompt, SamplingParams(max_new_tokens=16, temperature=0.7, seed=3, ignore_eos=True))
    )
    assert after.weight_version == "v1" and after.version_spans == (VersionSpan("v1", 0, 16),)
    assert_matches_rescore(weights_engine.model, prompt, after, 0.7)  # the reloaded (perturbed) weights
    fresh = await weights_client.generate(GenerateRequest(prompt, SamplingParams(max_new_tokens=16, temperature=0)))
    assert fresh.output_logprobs != head.output_logprobs[:16]  # the weights really changed


async def test_update_weights_pauses_reloads_and_continues_a_running_generation(
    weights_client, weights_engine, perturbed_weights, prompt
):
    """The refit a trainer triggers: pause in place, load from disk, continue; the stream is never aborted."""
    request = GenerateRequest(prompt, SamplingParams(max_new_tokens=300, ignore_eos=True, temperature=0))
    final, updated, seen = None, False, 0
    async for chunk in weights_client.stream(request):
        seen += len(chunk.output_ids)
        if seen >= 10 and not updated:
            await weights_client.update_weights(WeightUpdate("refit-1", path=str(perturbed_weights)))
            updated = True
        final = chunk.final or final
    assert final is not None and final.finish_reason is FinishReason.LENGTH and len(final.output_ids) == 300
    assert final.version_spans[-1].version == "refit-1" and final.version_spans[-1].end == 300
    assert not weights_engine.paused and await weights_client.weight_version() == "refit-1"
    await weights_client.update_weights(WeightUpdate("refit-2"))  # no path: relabel only, still resumed
    assert not weights_engine.paused and await weights_client.weight_version() == "refit-2"
    with pytest.raises(InvalidRequest, match="checkpoint path"):
        await weights_client.update_weights(WeightUpdate("x", tensors={}))


async def test_a_bad_checkpoint_is_refused_with_the_servers_message(weights_client, tmp_path: Path):
    with pytest.raises(InvalidRequest, match="no \\*.safetensors files"):
        await weights_client.update_weights_from_disk(tmp_path / "missing", "never")
    assert await weights_client.weight_version() != "never"


async def test_update_weight_version_relabels(weights_client):
    reply = await weights_client.update_weight_version("v2")
    assert reply["new_version"] == "v2"
    assert await weights_client.weight_version() == "v2"
    result = await weights_client.generate(GenerateRequest((1, 2, 3), SamplingParams(max_new_tokens=3)))
    assert result.weight_version == "v2"


async def test_pause_abort_returns_an_abort_result_with_partial_output(weights_client, prompt):
    request = GenerateRequest(prompt, SamplingParams(max_new_tokens=400, ignore_eos=True))
    seen = 0
    final = None
    paused = False
    try:
        async for chunk in weights_client.stream(request):
            seen += len(chunk.output_ids)
            if not paused and seen >= 5:  # a chunk may carry several tokens (those that arrived together)
                paused = True
                await weights_client.pause("abort")
            final = chunk.final or final
    finally:
        await weights_client.resume()
    assert final is not None and final.finish_reason is FinishReason.ABORT and final.matched_stop is None
    assert 5 <= len(final.output_ids) < 400 and len(final.output_logprobs) == len(final.output_ids)
    # Non-streaming as well: the abort is a result, not an exception.
    result = await weights_client.generate(GenerateRequest(prompt, SamplingParams(max_new_tokens=3)))
    assert result.finish_reason is FinishReason.LENGTH


async def test_pause_in_place_then_resume_completes(weights_client, prompt):
    request = GenerateRequest(prompt, SamplingParams(max_new_tokens=50, ignore_eos=True, temperature=0))
    reference = await weights_client.generate(request)
    seen = 0
    final = None
    resumer = None

    async def resume_soon() -> None:
        await asyncio.sleep(0.2)
        await weights_client.resume()

    async for chunk in weights_client.stream(request):
        seen += len(chunk.output_ids)
        if resumer is None and seen >= 5:  # a chunk may carry several tokens (those that arrived together)
            await weights_client.pause("in_place")
            resumer = asyncio.create_task(resume_soon())
        final = chunk.final or final
    assert resumer is not None and resumer.done()  # the stream could only end after the resume
    assert final is not None and same_output(final, reference)


@pytest.mark.parametrize("n", [0, 3, IDS_SLICE, IDS_SLICE + 1, 3 * IDS_SLICE + 7])
def test_a_long_prompt_is_serialised_in_slices_to_the_same_bytes(n: int) -> None:
    """The sliced body (the event loop free between slices) is byte for byte the one-call body, whatever the length
    and wherever else ``input_ids`` appears."""
    ids = _ids_json(array("i", [(i * 7919) % 151_000 for i in range(n)]))
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4}, "rid": "r", "extra": {"input_ids": []}}
    assert asyncio.run(_body_json(body)) == _json(body)


def test_a_prompt_given_as_json_parts_is_sent_as_the_same_bytes() -> None:
    """``GenerateRequest.input_ids_json`` (a session's earlier turns encoded already) gives the body its prompt
    without encoding it again: the same bytes as the body encoded whole."""
    ids = array("i", [(i * 7919) % 151_000 for i in range(3 * IDS_SLICE)])
    body = {"input_ids": _ids_json(ids), "sampling_params": {"max_new_tokens": 4}, "rid": "r", "extra": {"a": []}}
    parts = json_array([ids_text(ids[:5]), ids_text(ids[5:])])
    assert asyncio.run(_body_json(body, parts)) == _json(body)
