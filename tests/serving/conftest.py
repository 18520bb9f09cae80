"""Servers for the serving tests: the SGLang-shaped app over the session engine, on real loopback HTTP.

The session ``engine``'s weights are never changed here; tests that reload weights, relabel or pause
build their own engine (``control_engine``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from polar.models.engine import LocalEngine
from polar.serving.sglang_app import create_app
from polar.serving.threaded import ServerThread


@dataclass
class Served:
    url: str
    app: FastAPI
    engine: LocalEngine

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30.0)


def _serve(engine: LocalEngine, **kw: bool) -> Iterator[Served]:
    app = create_app(engine, served_model_name="tiny", **kw)
    with ServerThread(app) as server:
        yield Served(server.url, app, engine)


@pytest.fixture(scope="module")
def served(engine: LocalEngine) -> Iterator[Served]:
    """Cumulative streaming (SGLang's default)."""
    yield from _serve(engine)


@pytest.fixture(scope="module")
def served_incremental(engine: LocalEngine) -> Iterator[Served]:
    """``--incremental-streaming-output``."""
    yield from _serve(engine, incremental_streaming=True)


@pytest.fixture(scope="module")
def control_engine(tiny_model_dir: Path, small_tokenizer) -> Iterator[LocalEngine]:
    eng = LocalEngine(tiny_model_dir, small_tokenizer)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def served_control(control_engine: LocalEngine) -> Iterator[Served]:
    yield from _serve(control_engine)


@pytest.fixture(scope="session")
def chat_prompt(small_tokenizer) -> list[int]:
    return small_tokenizer.encode("<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n")
