"""Models as Hugging Face folders: ``polar model init``, reading a folder, finding the folder a server serves."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastapi import FastAPI

from polar.cli import main
from polar.errors import ConfigError
from polar.model_folder import folder_tokenizer, open_model_folder
from polar.models.resolve import ModelChoice, resolve_model_folder
from polar.serving.sglang_app import create_app
from polar.serving.threaded import ServerThread


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, monkeypatch_module: None) -> Path:
    out = tmp_path_factory.mktemp("models") / "small"
    assert main(["model", "init", str(out), "--tokenizer", "small", "--context", "8192"]) == 0
    return out


@pytest.fixture(scope="module")
def monkeypatch_module(cache_dir: Path):
    mp = pytest.MonkeyPatch()
    mp.setenv("POLAR_CACHE", str(cache_dir))
    from polar.settings import get_settings

    get_settings.cache_clear()
    yield None
    mp.undo()
    get_settings.cache_clear()


def test_init_writes_a_folder_polar_and_transformers_both_read(small_folder: Path, small_tokenizer) -> None:
    folder = open_model_folder(small_folder)
    assert folder.declared_chat_format == "qwen3" and folder.architectures == ("Qwen3ForCausalLM",)
    assert folder.vocab_size == small_tokenizer.vocab_size == 4096 and folder.context_length == 8192
    tok = folder_tokenizer(folder)
    assert tok.eos_ids == small_tokenizer.eos_ids
    assert tok.encode("def f(x):\n    return x") == small_tokenizer.encode("def f(x):\n    return x")
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(small_folder)
    assert hf.encode("hello <|im_end|>", add_special_tokens=False) == tok.encode("hello <|im_end|>")


def test_init_refuses_a_non_empty_folder_and_an_unknown_family(tmp_path: Path, monkeypatch_module: None) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main(["model", "init", str(tmp_path / "full"), "--tokenizer", "small"]) == 2
    assert main(["model", "init", str(tmp_path / "new"), "--tokenizer", "small", "--family", "nope"]) == 2
    assert not (tmp_path / "new").exists()  # nothing half-made


def test_a_folder_without_a_tokenizer_is_a_clear_error(small_folder: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(small_folder, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match="has no tokenizer.json"):
        open_model_folder(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        open_model_folder(tmp_path / "nowhere")


def test_the_folder_a_sglang_server_reports_is_used(small_folder: Path, cache_dir: Path) -> None:
    from polar.models.engine import LocalEngine

    folder = open_model_folder(small_folder)
    engine = LocalEngine(folder.path, folder_tokenizer(folder))
    try:
        with ServerThread(create_app(engine, served_model_name="small")) as server:
            found = resolve_model_folder(ModelChoice(None, server.url, "tiny", cache_dir))
    finally:
        engine.close()
    assert found.path == folder.path


def test_a_served_folder_that_is_not_here_says_what_to_set(cache_dir: Path) -> None:
    app = FastAPI()  # vLLM's /v1/models, as vLLM answers it for a model loaded from a hub name

    @app.get("/v1/models")
    def models() -> dict:
        return {
            "object": "list",
            "data": [{"id": "Qwen/Qwen3-8B", "object": "model", "root": "Qwen/Qwen3-8B", "max_model_len": 40960}],
        }

    with ServerThread(app) as server, pytest.raises(ConfigError) as info:
        resolve_model_folder(ModelChoice(None, server.url, "tiny", cache_dir))
    assert "'Qwen/Qwen3-8B'" in info.value.message and "POLAR_MODEL_PATH" in info.value.message


def test_the_gateway_reads_its_tokenizer_from_the_model_path(small_folder: Path, tmp_path: Path) -> None:
    import asyncio

    from polar.proxy.gateway import Gateway
    from polar.settings import Settings

    settings = Settings(home=tmp_path, model_path=small_folder, model="does-not-matter")

    async def start() -> tuple[Path, Path | None]:
        gateway = await Gateway.create(settings)
        try:
            return gateway.tokenizer.path, gateway.model_dir
        finally:
            await gateway.aclose()

    tokenizer_path, model_dir = asyncio.run(start())
    assert tokenizer_path == small_folder.resolve() / "tokenizer.json" and model_dir == small_folder.resolve()
    assert json.loads((small_folder / "config.json").read_text())["polar_chat_format"] == "qwen3"
