from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def long_model_cache(cache_dir: Path) -> Path:
    """The cache with the ``tiny-long`` model (64k positions: the CLIs send 6k-40k-token prompts) built, so
    the runs inside the namespace only load it."""
    from polar.models.tiny import ensure_model_dir
    from polar.tokens.tokenizer import load_tokenizer

    load_tokenizer("small", cache_dir)
    ensure_model_dir("tiny-long", cache_dir)
    return cache_dir


_TIMINGS: list[dict] = []


@pytest.fixture
def e2e_timings() -> list[dict]:
    """Per-run timings, printed in the terminal summary."""
    return _TIMINGS


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _TIMINGS:
        return
    terminalreporter.section("e2e harness timings (s)")
    for t in _TIMINGS:
        terminalreporter.write_line(
            f"{t['harness']:18} wall {t['wall_s']:6.1f}  gateway start {t['startup_s']:5.1f}  cli {t['cli_s']:6.1f}  "
            f"calls {t['calls']} (gateway {t['gateway_s']:5.2f})  largest prompt {t['max_prompt']} tokens"
        )
