"""The local engine: SGLang's sampling and logprob semantics, stops, context limits, weights, pause."""

from __future__ import annotations

import asyncio

import pytest
import torch

from polar.errors import ContextLengthExceeded, InvalidRequest, UnknownSamplingParameter
from polar.inference import FinishReason, GenerateRequest, LogprobSemantics, SamplingParams, collect
from polar.models.engine import LocalEngine, PauseMode
from polar.models.sampling import rescore


def prompt(tokenizer, text: str = "hello there") -> tuple[int, ...]:
    return tuple(tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"))


async def run(engine, ids, **sampling):
    return await collect(engine.stream(GenerateRequest(ids, SamplingParams(**sampling))))


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
@pytest.mark.parametrize("semantics", list(LogprobSemantics))
async def test_logprobs_match_teacher_forced_rescore(tiny_model_dir, small_tokenizer, temperature, semantics):
    engine = LocalEngine(tiny_model_dir, small_tokenizer, semantics=semantics)
    ids = prompt(small_tokenizer)
    result = await run(engine, ids, max_new_tokens=64, temperature=temperature, seed=7, ignore_eos=True)
    assert len(result.output_ids) == len(result.output_logprobs) == 64
    expected = rescore(engine.model, list(ids) + list(result.output_ids), len(ids), temperature, semantics)
    assert max(abs(a - b) for a, b in zip(expected, result.output_logprobs, strict=True)) < 1e-5
    assert result.logprob_semantics is semantics
    engine.close()


async def test_seed_makes_sampling_reproducible(engine, small_tokenizer):
    ids = prompt(small_tokenizer)
    a = await run(engine, ids, max_new_tokens=32, temperature=1.0, seed=3, ignore_eos=True)
    b = await run(engine, ids, max_new_tokens=32, temperature=1.0, seed=3, ignore_eos=True)
    c = await run(engine, ids, max_new_tokens=32, temperature=1.0, seed=4, ignore_eos=True)
    assert a.output_ids == b.output_ids and a.output_logprobs == b.output_logprobs
    assert a.output_ids != c.output_ids


async def test_stop_token_is_kept_with_its_logprob(engine, small_tokenizer):
    ids = prompt(small_tokenizer)
    free = await run(engine, ids, max_new_tokens=40, temperature=0.0)
    stop_at = free.output_ids[5]
    result = await run(engine, ids, max_new_tokens=40, temperature=0.0, stop_token_ids=[stop_at])
    assert result.finish_reason is FinishReason.STOP and result.matched_stop == stop_at
    assert result.output_ids[-1] == stop_at and len(result.output_logprobs) == len(result.output_ids)
    assert result.output_ids == free.output_ids[: free.output_ids.index(stop_at) + 1]


async def test_stop_string_cuts_after_the_completing_token(engine, small_tokenizer):
    ids = prompt(small_tokenizer)
    free = await run(engine, ids, max_new_tokens=40, temperature=0.0)
    text = small_tokenizer.decode(free.output_ids)
    stop = text[10:13]
    result = await run(engine, ids, max_new_tokens=40, temperature=0.0, stop=[stop])
    assert result.finish_reason is FinishReason.STOP and result.matched_stop == stop
    decoded = small_tokenizer.decode(result.output_ids)
    assert stop in decoded and stop not in small_tokenizer.decode(result.output_ids[:-1])


async def test_length_and_min_new_tokens(engine, small_tokenizer):
    ids = prompt(small_tokenizer)
    result = await run(engine, ids, max_new_tokens=5, temperature=0.0, ignore_eos=True)
    assert result.finish_reason is FinishReason.LENGTH and len(result.output_ids) == 5
    eos = next(iter(small_tokenizer.eos_ids))
    early = await run(engine, ids, max_new_tokens=30, temperature=1.0, seed=1, min_new_tokens=20, stop_token_ids=[eos])
    assert not set(early.output_ids[:20]) & (small_tokenizer.eos_ids | {eos})


async def test_generation_is_capped_by_the_context_window(engine, small_tokenizer):
    ids = (small_tokenizer.im_start_id,) * (engine.context_length - 3)
    result = await run(engine, ids, max_new_tokens=50, temperature=0.0, ignore_eos=True)
    assert result.finish_reason is FinishReason.LENGTH and len(result.output_ids) == 3


async def test_bad_input_gets_named_errors(engine, small_tokenizer):
    with pytest.raises(ContextLengthExceeded, match="context window is 4096"):
        await run(engine, (1,) * 5000)
    with pytest.raises(InvalidRequest, match="input_ids must not be empty"):
        await run(engine, ())
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        await run(engine, (1, 999_999))
    with pytest.raises(UnknownSamplingParameter, match="'max_tokens'"):
        SamplingParams.parse({"max_tokens": 3})
    with pytest.raises(InvalidRequest, match="'temperature'"):
        SamplingParams.parse({"temperature": "hot"})


async def test_concurrent_generations_interleave(engine, small_tokenizer):
    ids = prompt(small_tokenizer)
    alone = await run(engine, ids, max_new_tokens=20, temperature=1.0, seed=11, ignore_eos=True)
    together = await asyncio.gather(
        *(run(engine, ids, max_new_tokens=20, temperature=1.0, seed=11, ignore_eos=True) for _ in range(4))
    )
    assert all(r.output_ids == alone.output_ids for r in together)


def perturbed(model) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


async def test_weight_update_mid_generation_records_version_spans(tiny_model_dir, small_tokenizer):
    engine = LocalEngine(tiny_model_dir, small_tokenizer)
    ids = prompt(small_tokenizer)
    new_weights = perturbed(engine.model)
    chunks = engine.stream(GenerateRequest(ids, SamplingParams(max_new_tokens=60, temperature=0.0, ignore_eos=True)))
    seen = 0
    async for chunk in chunks:
        seen += len(chunk.output_ids)
        if seen == 25:
            await engine.load_weights(new_weights, "v1")
        if chunk.final:
            result = chunk.final
    spans = [(s.version, s.start, s.end) for s in result.version_spans]
    assert spans[0][0] == "default" and spans[-1] == ("v1", spans[-1][1], 60)
    assert spans[0][2] == spans[-1][1] and 25 <= spans[-1][1] <= 27
    after = await run(engine, ids, max_new_tokens=10, temperature=0.0, ignore_eos=True)
    assert [s.version for s in after.version_spans] == ["v1"]
    expected = rescore(engine.model, list(ids) + list(after.output_ids), len(ids), 0.0, engine.semantics)
    assert max(abs(a - b) for a, b in zip(expected, after.output_logprobs, strict=True)) < 1e-5
    engine.close()


async def test_pause_abort_returns_partial_output(engine, small_tokenizer):
    ids = prompt(small_tokenizer)
    task = asyncio.create_task(run(engine, ids, max_new_tokens=2000, temperature=0.0, ignore_eos=True))
    await asyncio.sleep(0.2)
    engine.pause(PauseMode.ABORT)
    result = await task
    engine.resume()
    assert result.finish_reason is FinishReason.ABORT and 0 < len(result.output_ids) < 2000
    assert len(result.output_logprobs) == len(result.output_ids)


@pytest.mark.parametrize("mode", [PauseMode.IN_PLACE, PauseMode.RETRACT])
async def test_pause_freezes_and_resume_completes(tiny_model_dir, small_tokenizer, mode):
    engine = LocalEngine(tiny_model_dir, small_tokenizer)
    ids = prompt(small_tokenizer)
    reference = await run(engine, ids, max_new_tokens=80, temperature=0.0, ignore_eos=True)
    task = asyncio.create_task(run(engine, ids, max_new_tokens=80, temperature=0.0, ignore_eos=True))
    await asyncio.sleep(0.05)
    engine.pause(mode)
    await asyncio.sleep(0.1)
    assert not task.done()
    engine.resume()
    result = await task
    assert result.finish_reason is FinishReason.LENGTH and len(result.output_ids) == 80
    # Freezing (and, under retract, recomputing the prefix) keeps greedy decoding greedy and logprobs true. The
    # ids may differ from an uninterrupted run only where two logits tie within float noise.
    ids = list(ids) + list(result.output_ids)
    expected = rescore(engine.model, ids, len(ids) - 80, 0.0, engine.semantics)
    assert max(abs(a - b) for a, b in zip(expected, result.output_logprobs, strict=True)) < 1e-5
    with torch.no_grad():
        logits = engine.model(torch.tensor([ids])).logits[0, len(ids) - 81 : -1]
    best = torch.log_softmax(logits.float(), -1).max(-1).values.tolist()
    assert all(lp >= top - 1e-5 for lp, top in zip(result.output_logprobs, best, strict=True))
    if result.output_ids != reference.output_ids:
        first = next(i for i, (a, b) in enumerate(zip(result.output_ids, reference.output_ids, strict=True)) if a != b)
        assert abs(result.output_logprobs[first] - reference.output_logprobs[first]) < 1e-4
    engine.close()


async def test_prefix_cache_reuses_earlier_turns_exactly(tiny_model_dir, small_tokenizer):
    engine = LocalEngine(tiny_model_dir, small_tokenizer)
    first_prompt = prompt(small_tokenizer, "a long first question " * 20)
    first = await run(engine, first_prompt, max_new_tokens=12, temperature=0.0, ignore_eos=True)
    follow = first_prompt + first.output_ids + prompt(small_tokenizer, "and a follow-up")
    second = await run(engine, follow, max_new_tokens=12, temperature=0.7, seed=5, ignore_eos=True)
    assert engine.prefix_cache.hits == 1 and engine.prefix_cache.reused_tokens >= len(first_prompt)
    expected = rescore(engine.model, list(follow) + list(second.output_ids), len(follow), 0.7, engine.semantics)
    assert max(abs(a - b) for a, b in zip(expected, second.output_logprobs, strict=True)) < 1e-5
    scored = await engine.score(list(follow), list(second.output_ids), 0.7)
    assert max(abs(a - b) for a, b in zip(expected, scored, strict=True)) < 1e-5
    await engine.load_weights(perturbed(engine.model), "v1")  # cached keys/values belong to the old weights
    hits = engine.prefix_cache.hits
    after = await run(engine, follow, max_new_tokens=4, temperature=0.0)
    assert engine.prefix_cache.hits == hits
    expected = rescore(engine.model, list(follow) + list(after.output_ids), len(follow), 0.0, engine.semantics)
    assert max(abs(a - b) for a, b in zip(expected, after.output_logprobs, strict=True)) < 1e-5
    engine.close()


@pytest.mark.parametrize("damage", ["missing", "shape"])
async def test_bad_checkpoints_change_nothing(tiny_model_dir, small_tokenizer, damage):
    engine = LocalEngine(tiny_model_dir, small_tokenizer)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    bad = perturbed(engine.model)
    if damage == "missing":
        bad.pop("lm_head.weight")
    else:
        bad["model.norm.weight"] = torch.ones(3)
    with pytest.raises(InvalidRequest, match="weights do not fit"):
        await engine.load_weights(bad, "broken")
    assert engine.weight_version == "default"
    assert all(torch.equal(v, before[k]) for k, v in engine.model.state_dict().items())
    engine.close()
