"""Chat-format families: which one a model folder uses.

``detect_family(folder, override)``: the override (``POLAR_CHAT_FORMAT``) when set, else what the folder
declares (``polar_chat_format`` in config.json, written by ``polar model init``), else a rule on the folder's
architecture, model type and name, else ``jinja`` (the folder's own chat_template, canonical mode only) when it
has one. Anything else is a ConfigError listing the known families.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from polar.errors import ConfigError
from polar.model_folder import ModelFolder


@dataclass(frozen=True)
class Family:
    """A chat-format family: its name, what it is for, and how its ChatFormat is built (``polar.chat.chat_format_for``):
    our own ChatML code with ``tool_format`` (a polar.tokens.parsers format), else the renderers-library config
    ``renderer``, else the folder's own Jinja template."""

    name: str
    description: str
    renderer: str | None = None  # renderers.config_from_name(...) name
    tool_format: str | None = None  # our own template and parser (NativeFormat)
    calls_delimited: bool = True  # tool calls open with a marker of their own (Llama 3: bare JSON content)
    harmony_vocab: bool = False  # its renderer (openai_harmony) reads o200k's ranks from a file
    # Renderer settings for writing scripted replies (polar.chat.reply): keep a final turn's reasoning.
    reply_config: tuple[tuple[str, object], ...] = ()


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("qwen3", "Qwen3 / Qwen2.5 ChatML with Hermes <tool_call> JSON (our own template)", tool_format="hermes"),
        Family(
            "qwen3_coder",
            "Qwen3-Coder: ChatML with <function=...><parameter=...> tool calls (our own)",
            tool_format="qwen3_coder",
        ),
        Family("qwen35", "Qwen3.5 (renderers)", "qwen3.5"),
        Family("qwen36", "Qwen3.6 (renderers)", "qwen3.6"),
        Family("glm45", "GLM-4.5 / 4.6 / 4.7 (renderers)", "glm-4.5"),
        Family("kimi_k2", "Kimi-K2 (renderers)", "kimi-k2"),
        Family("deepseek_v3", "DeepSeek-V3.x (renderers)", "deepseek-v3"),
        Family(
            "gpt_oss",
            "gpt-oss Harmony (renderers)",
            "gpt-oss",
            harmony_vocab=True,
            reply_config=(("auto_drop_analysis", False),),
        ),
        Family("llama3", "Llama 3.x (renderers)", "llama-3", calls_delimited=False),
        Family("minimax_m2", "MiniMax-M2 (renderers)", "minimax-m2"),
        Family("jinja", "the folder's own Jinja chat_template, canonical mode only"),
    )
}

# (regex on "architectures model_type name", lower-cased) -> family; first match wins, so the specific
# rules come first (Kimi-K2 reuses DeepSeek-V3's architecture, Qwen3-Coder Qwen3's).
_RULES: tuple[tuple[str, str], ...] = (
    (r"kimi", "kimi_k2"),
    (r"qwen3[._-]?6", "qwen36"),
    (r"qwen3[._-]?5|qwen3_5", "qwen35"),
    (r"qwen3.*coder|coder.*qwen3", "qwen3_coder"),
    (r"qwen3|qwen2", "qwen3"),
    (r"glm4moe|glm-?4\.[5-9]|glm4_moe", "glm45"),
    (r"deepseekv3|deepseek_v3|deepseek-v3", "deepseek_v3"),
    (r"gptoss|gpt_oss|gpt-oss", "gpt_oss"),
    (r"minimaxm2|minimax_m2|minimax-m2", "minimax_m2"),
    (r"llama-?3|llama3", "llama3"),
)


def known() -> str:
    return ", ".join(FAMILIES)


def get_family(name: str) -> Family:
    """The family called ``name``; ConfigError listing the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(f"unknown chat format {name!r}; known chat formats: {known()}", field="chat_format") from None


def detect_family(folder: ModelFolder, override: str = "") -> Family:
    if override:
        return get_family(override)
    if folder.declared_chat_format:
        return get_family(folder.declared_chat_format)
    text = " ".join((*folder.architectures, folder.model_type, folder.name)).lower()
    for pattern, family in _RULES:
        if re.search(pattern, text):
            return FAMILIES[family]
    if folder.chat_template:
        return FAMILIES["jinja"]
    raise ConfigError(
        f"cannot tell the chat format of {folder.path} (architectures {list(folder.architectures)}, name "
        f"{folder.name!r}) and it has no chat_template; set POLAR_CHAT_FORMAT to one of: {known()}",
        field="chat_format",
    )
