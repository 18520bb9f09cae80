"""The dependency rule between packages (docs/architecture.md), as import-linter checks it from pyproject.toml."""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import EXIT_STATUS_SUCCESS, lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_every_layering_contract_is_kept(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert (
        lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == EXIT_STATUS_SUCCESS
    )
