"""The process's model choice from now on: ``POLAR_MODEL_PATH`` (a command's ``--model-path`` flag) and
``POLAR_MODEL`` (the demo's real-model part). Set in the environment, so the flows this process starts inherit it,
and the cached settings are dropped so the next ``get_settings()`` reads it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from polar.settings import Settings


def use_model_path(path: Path | None) -> None:
    """A ``--model-path`` flag: the process's POLAR_MODEL_PATH from now on (flows it starts inherit it)."""
    if path is None:
        return
    from polar.settings import get_settings

    os.environ["POLAR_MODEL_PATH"] = str(Path(path).expanduser().resolve())
    get_settings.cache_clear()


def use_model(name: str) -> Settings:
    """The process's POLAR_MODEL from now on (flows read the process's settings); returns the new settings."""
    from polar.settings import get_settings

    os.environ["POLAR_MODEL"] = name
    get_settings.cache_clear()
    return get_settings()
