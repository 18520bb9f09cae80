"""Shared fixtures: a per-session cache folder, the real tokenizers, and the tiny local model.

Test modules add their own fixtures in conftest.py files beside them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests must never reach a hub or phone home.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
# Control routes are closed by default. Tests run gateways, APIs and flow workers with different POLAR_HOMEs, as a
# deployment runs them on different machines, so they share one configured token (tests/auth tests the default).
TEST_CONTROL_TOKEN = "polar-test-control-token"
os.environ.setdefault("POLAR_CONTROL_TOKEN", TEST_CONTROL_TOKEN)
CONTROL = {"Authorization": f"Bearer {os.environ['POLAR_CONTROL_TOKEN']}"}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Model/tokenizer cache. POLAR_TEST_CACHE reuses one across runs (the builds are deterministic)."""
    shared = os.environ.get("POLAR_TEST_CACHE")
    return Path(shared) if shared else tmp_path_factory.mktemp("polar-cache")


@pytest.fixture(scope="session")
def small_tokenizer(cache_dir: Path):
    from polar.tokens.tokenizer import load_tokenizer

    return load_tokenizer("small", cache_dir)


@pytest.fixture(scope="session")
def qwen_tokenizer(cache_dir: Path):
    from polar.tokens.tokenizer import load_tokenizer

    return load_tokenizer("qwen", cache_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(cache_dir: Path) -> Path:
    from polar.models.tiny import ensure_model_dir

    return ensure_model_dir("tiny", cache_dir)


@pytest.fixture(scope="session")
def engine(tiny_model_dir: Path, small_tokenizer):
    """One engine for the session (its weights are never changed; weight tests build their own)."""
    from polar.models.engine import LocalEngine

    eng = LocalEngine(tiny_model_dir, small_tokenizer)
    yield eng
    eng.close()
