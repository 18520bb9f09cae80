"""The browser the UI tests drive: Debian's ``chromium`` (``scripts/browser_env.sh`` installs it), through
Playwright with ``executable_path``; Playwright's own browser downloads are never used."""

from __future__ import annotations

import os
import shutil

import pytest


def chromium_path() -> str | None:
    return shutil.which("chromium")


def require_chromium() -> str:
    """The path of chromium, or skip (fail under ``CI=true``, where ``make tools`` installs it)."""
    path = chromium_path()
    if path is None:
        reason = "chromium is not installed (scripts/browser_env.sh installs Debian's package)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return path
