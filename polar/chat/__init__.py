"""Chat formats per model family: render, parse, extend (append mode) behind one protocol (protocol.py)."""

from __future__ import annotations

from polar.chat.families import FAMILIES, Family, detect_family, get_family
from polar.chat.protocol import ChatFormat, OutputStream, ReparseStreamParser
from polar.errors import ConfigError
from polar.model_folder import ModelFolder, folder_tokenizer


def chat_format_for(folder: ModelFolder, override: str = "") -> ChatFormat:
    """The chat format of a model folder (``override``: POLAR_CHAT_FORMAT), whatever its family: the family
    registry (families.py) says how it is built. ConfigError when the family is unknown, when the folder's
    tokenizer lacks what the family's format needs, or when a Jinja fallback template does not render."""
    family = detect_family(folder, override)
    if family.tool_format is not None:
        from polar.chat.native import NativeFormat

        return NativeFormat(family.name, folder_tokenizer(folder), family.tool_format)
    if family.renderer is not None:
        from polar.chat.library import LibraryFormat

        return LibraryFormat.from_family(family, folder.path, folder.name)
    from polar.chat.jinja import JinjaFormat

    return JinjaFormat.from_folder(folder)


__all__ = [
    "FAMILIES",
    "ChatFormat",
    "ConfigError",
    "Family",
    "OutputStream",
    "ReparseStreamParser",
    "chat_format_for",
    "detect_family",
    "get_family",
]
