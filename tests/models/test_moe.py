"""The tiny Qwen3-MoE model: ``polar model init --moe`` with the real Qwen vocabulary, and the local engine's
routed experts and top-k logprobs, which must equal one uncached pass over the whole sequence whatever prefix
the engine reused from its cache."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from polar.cli import main
from polar.inference import ExtrasRequest, GenerateRequest, SamplingParams, collect
from polar.model_folder import folder_tokenizer, open_model_folder
from polar.models.engine import LocalEngine
from polar.models.moe import routing_of, top_logprobs_of
from polar.models.moe_shape import moe_shape


@pytest.fixture(scope="module")
def qwen_moe(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    mp = pytest.MonkeyPatch()
    mp.setenv("POLAR_CACHE", str(cache_dir))
    from polar.settings import get_settings

    get_settings.cache_clear()
    out = tmp_path_factory.mktemp("moe") / "qwen-moe"
    try:
        assert (
            main(["model", "init", str(out), "--tokenizer", "qwen", "--moe", "--experts", "16", "--hidden", "32"]) == 0
        )
    finally:
        mp.undo()
        get_settings.cache_clear()
    return out


def test_init_moe_writes_a_qwen3_moe_folder_with_the_real_vocabulary(qwen_moe: Path) -> None:
    config = json.loads((qwen_moe / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    shape = moe_shape(config)  # transformers 5 writes num_local_experts, older Qwen-MoE configs num_experts
    assert shape is not None and (shape.layers, shape.top_k, shape.num_experts) == (2, 2, 16)
    assert shape.dtype == np.uint8
    folder = open_model_folder(qwen_moe)
    tokenizer = folder_tokenizer(folder)
    assert tokenizer.encode("You are a helpful assistant.") == [2610, 525, 264, 10950, 17847, 13]


def test_the_engine_reports_what_a_whole_sequence_pass_computes(qwen_moe: Path) -> None:
    folder = open_model_folder(qwen_moe)
    engine = LocalEngine(folder.path, folder_tokenizer(folder))
    assert engine.router_tap is not None
    shape = engine.router_tap.shape

    async def turns() -> None:
        ids = folder_tokenizer(folder).encode("Hello there, how are you today? " * 4)
        rows_before = 0
        for turn in range(3):  # each turn extends the last: the prefix cache serves all but the new positions
            extras = ExtrasRequest(top_logprobs=5, routed_experts=True, routed_experts_start=rows_before)
            sampling = SamplingParams(max_new_tokens=6, temperature=0.9, seed=turn)
            result = await collect(engine.stream(GenerateRequest(tuple(ids), sampling, extras=extras)))
            assert result.extras is not None
            sequence = [*ids, *result.output_ids]
            expected = routing_of(engine.model, sequence, shape)
            assert np.array_equal(result.extras.routed_experts, expected[rows_before:-1])
            top_ids, top_lp = top_logprobs_of(engine.model, sequence, len(ids), 5, 0.9)
            assert np.array_equal(result.extras.top_ids, top_ids)
            assert np.abs(result.extras.top_logprobs - top_lp).max() <= 1e-5
            rows_before = len(sequence) - 1
            ids = sequence + folder_tokenizer(folder).encode(f" Turn {turn}.")

    try:
        asyncio.run(turns())
        assert engine.prefix_cache.hits >= 2
    finally:
        engine.close()


def test_replaying_the_stored_routing_reproduces_the_stored_logprobs(cache_dir: Path) -> None:
    from polar.models.moe import replayed_logprobs
    from polar.models.tiny import ensure_model_dir

    folder = open_model_folder(ensure_model_dir("tiny-moe", cache_dir))
    engine = LocalEngine(folder.path, folder_tokenizer(folder))
    prompt = list(range(200, 260))
    extras = ExtrasRequest(routed_experts=True)
    try:
        request = GenerateRequest(
            tuple(prompt), SamplingParams(max_new_tokens=12, temperature=0.8, seed=5), extras=extras
        )
        result = asyncio.run(collect(engine.stream(request)))
        ids = [*prompt, *result.output_ids]
        assert result.extras is not None and result.extras.routed_experts is not None
        stored = result.extras.routed_experts
        replayed = replayed_logprobs(engine.model, ids, stored, len(prompt), 0.8)
        assert np.abs(np.asarray(replayed) - np.asarray(result.output_logprobs)).max() <= 1e-5
        shuffled = (stored.astype(np.int64) + 1) % 8  # another routing: the logprobs move
        moved = replayed_logprobs(engine.model, ids, shuffled, len(prompt), 0.8)
        assert np.abs(np.asarray(moved) - np.asarray(result.output_logprobs)).max() > 1e-3
    finally:
        engine.close()
