"""At start, the tokenizer is checked against the served model; the judge is its own model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fastapi import FastAPI

from polar.errors import ConfigError
from polar.models.check import PROBE, check_tokenizer_against_server, checked_model
from polar.models.resolve import ModelChoice, judge_settings
from polar.serving.sglang_app import create_app
from polar.serving.threaded import ServerThread
from polar.settings import BackendKind, Settings


@pytest.fixture(scope="module")
def served(engine):
    """``polar serve-model``'s app on the tiny model (4,096-id small vocabulary)."""
    with ServerThread(create_app(engine, served_model_name="tiny")) as server:
        yield server.url


def test_the_served_models_own_tokenizer_passes_every_check(served: str, small_tokenizer) -> None:
    assert check_tokenizer_against_server(small_tokenizer, served) == ["vocab_size", "eos_token_ids", "probe"]


def test_a_tokenizer_of_another_model_is_refused_naming_both_sides(served: str, qwen_tokenizer) -> None:
    with pytest.raises(ConfigError) as info:
        check_tokenizer_against_server(qwen_tokenizer, served)
    message = info.value.message
    assert "vocabulary mismatch" in message and "151669" in message and "4096" in message and served in message


def test_same_size_other_ids_are_caught_by_the_probe(small_tokenizer) -> None:
    app = FastAPI()  # a server that reports nothing but tokenizes (SGLang's and vLLM's /tokenize answer)

    @app.post("/tokenize")
    def tokenize() -> dict:
        ids = [i + 1 for i in small_tokenizer.encode(PROBE)]
        return {"tokens": ids, "count": len(ids), "max_model_len": 4096}

    with ServerThread(app) as server, pytest.raises(ConfigError, match="disagree on a probe string"):
        check_tokenizer_against_server(small_tokenizer, server.url)


def test_the_gateway_does_not_start_on_a_mismatch(served: str, cache_dir: Path, tmp_path: Path) -> None:
    from polar.models.tiny import ensure_model_dir
    from polar.proxy.gateway import Gateway

    qwen_folder = ensure_model_dir("tiny-qwen", cache_dir)
    settings = Settings(home=tmp_path, cache=cache_dir, backend=BackendKind.SGLANG, backend_url=served)
    with pytest.raises(ConfigError, match="vocabulary mismatch"):
        asyncio.run(Gateway.create(settings.model_copy(update={"model_path": qwen_folder})))
    assert not (tmp_path / "polar.db").exists()  # nothing half-started: not even the store was migrated
    # Without a path the gateway takes the folder the server reports, which agrees with it.

    async def start() -> Path | None:
        gateway = await Gateway.create(settings)
        try:
            return gateway.model_dir
        finally:
            await gateway.aclose()

    assert asyncio.run(start()) == ensure_model_dir("tiny", cache_dir).resolve()


def test_the_gateway_refuses_a_family_its_tokenizer_cannot_carry(cache_dir: Path, tmp_path: Path) -> None:
    from polar.models.init import TinyModelSpec, init_model_folder
    from polar.proxy.gateway import Gateway

    folder = init_model_folder(TinyModelSpec(tokenizer="small", chat_format="glm45"), tmp_path / "glm", cache_dir)
    settings = Settings(home=tmp_path, cache=cache_dir, model_path=folder)
    # GLM-4.5's format needs its own special tokens; a 4k vocabulary without them is refused before anything starts.
    with pytest.raises(ConfigError, match="the glm45 chat format cannot be built on tokenizer"):
        asyncio.run(Gateway.create(settings))
    assert not (tmp_path / "polar.db").exists()
    with pytest.raises(ConfigError, match="unknown chat format 'nope'"):
        asyncio.run(Gateway.create(settings.model_copy(update={"chat_format": "nope"})))


def test_the_judge_is_its_own_model(served: str, cache_dir: Path, tmp_path: Path, small_tokenizer) -> None:
    embedded = Settings(home=tmp_path, cache=cache_dir)
    assert judge_settings(embedded) is embedded  # the embedded demo: the policy judges
    remote = Settings(home=tmp_path, cache=cache_dir, backend=BackendKind.SGLANG, backend_url="http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="POLAR_JUDGE_URL"):
        judge_settings(remote)  # a remote policy is never silently its own judge
    judged = remote.model_copy(update={"judge_url": served, "judge_backend": BackendKind.SGLANG})
    assert judge_settings(judged).backend_url == served
    folder, tokenizer = checked_model(ModelChoice.judge(judged))
    assert tokenizer.vocab_size == small_tokenizer.vocab_size and folder.vocab_size == 4096
