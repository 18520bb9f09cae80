"""Chat formats per model family: render, parse, extend (append mode) behind one protocol (protocol.py)."""

from __future__ import annotations

from polar.chat.families import FAMILIES, Family, detect_family, get_family
from polar.chat.protocol import ChatFormat, ReparseStreamParser
from polar.errors import ConfigError
from polar.models.folder import ModelFolder, folder_tokenizer


def chat_format_for(folder: ModelFolder, override: str = "") -> ChatFormat:
    """The chat format of a model folder (``override``: POLAR_CHAT_FORMAT). ConfigError when the family is
    unknown, or when it is ``jinja`` (the folder's own template: canonical renders only, see families.py)."""
    family = detect_family(folder, override)
    if family.renderer is None and family.name in ("qwen3", "qwen3_coder"):
        from polar.chat.native import NativeFormat

        return NativeFormat(family.name, folder_tokenizer(folder))
    if family.renderer is not None:
        from polar.chat.library import LibraryFormat

        return LibraryFormat.from_folder(family.name, family.renderer, folder.path, folder.name)
    from polar.chat.jinja import JinjaFormat

    return JinjaFormat.from_folder(folder)


__all__ = [
    "FAMILIES",
    "ChatFormat",
    "ConfigError",
    "Family",
    "ReparseStreamParser",
    "chat_format_for",
    "detect_family",
    "get_family",
]
