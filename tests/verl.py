"""Running a probe module under verl's overlay (``bash scripts/verl_env.sh``; the ``verl_site`` fixture)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_probe(verl_site: Path, module: str, *args: str) -> dict[str, Any]:
    """``python -m module args...`` with verl importable; the JSON of the last line it prints as ``PROBE {...}``."""
    env = {**os.environ, "PYTHONPATH": f"{verl_site}{os.pathsep}{ROOT}"}
    run = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("PROBE ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    out: dict[str, Any] = json.loads(lines[-1].removeprefix("PROBE "))
    return out
