"""The fallback for a family we do not know: the folder's own Jinja chat_template, canonical mode only.

Renders through the library's DefaultRenderer (``tokenizer.apply_chat_template``); ``extend`` is always None
(a template's turn close is unknown, so append mode is never provably safe). At start the template must show
it can render tools: a probe conversation with one tool must mention the tool's name, else ConfigError.
"""

from __future__ import annotations

from collections.abc import Sequence

from polar.chat.library import LibraryFormat
from polar.errors import ConfigError
from polar.models.folder import ModelFolder
from polar.tokens.messages import Message, Role, ToolSpec

PROBE_TOOL = ToolSpec("polar_probe_tool", "probe", {"type": "object", "properties": {}})


class JinjaFormat(LibraryFormat):
    prefix_stable = False

    @classmethod
    def from_folder(cls, folder: ModelFolder) -> JinjaFormat:  # type: ignore[override]
        if not folder.chat_template:
            raise ConfigError(f"{folder.path} has no chat_template to fall back on", field="chat_format")
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(str(folder.path))
        tok.name_or_path = folder.name
        fmt = cls("jinja", "default", tok)
        try:
            ids = fmt.render_ids([Message(Role.USER, "hi")], [PROBE_TOOL])
        except Exception as exc:
            raise ConfigError(
                f"the chat_template of {folder.path} does not render: {exc}", field="chat_format"
            ) from exc
        if PROBE_TOOL.name not in tok.decode(ids):
            raise ConfigError(
                f"the chat_template of {folder.path} cannot render tools (a tool given to it does not appear in the "
                "prompt); agents need tools: set POLAR_CHAT_FORMAT to a known family",
                field="chat_format",
            )
        return fmt

    def extend(
        self,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        new_messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
    ) -> list[int] | None:
        return None
