"""The fallback for a family we do not know: the folder's own Jinja chat_template, canonical mode only.

Renders through the library's DefaultRenderer (``tokenizer.apply_chat_template``); ``extend`` is always None
(a template's turn close is unknown, so append mode is never provably safe). At start a probe conversation with
one tool tells whether the template renders tools (the tool's name appears in the prompt). Many small chat models
have no tool section (SmolLM2's ChatML template drops ``tools`` silently): such a format serves every call
without tools and refuses a call with tools as an InvalidRequest naming ``tools`` (the caller's 400), rather
than sampling from a prompt that never showed the model its tools.
"""

from __future__ import annotations

from collections.abc import Sequence

from polar.chat.library import LibraryFormat
from polar.errors import ConfigError, InvalidRequest
from polar.model_folder import ModelFolder
from polar.tokens.lazy_ids import JoinedIds
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
        fmt.renders_tools = PROBE_TOOL.name in tok.decode(ids)
        return fmt

    renders_tools = True

    def render_ids(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, add_generation_prompt: bool = True
    ) -> list[int]:
        if tools and not self.renders_tools:
            raise InvalidRequest(
                "tools: this model's chat template has no tool-call section, so it cannot be shown tools; send the "
                "request without tools, or serve a model whose template renders them",
                field="tools",
            )
        return super().render_ids(messages, tools, add_generation_prompt=add_generation_prompt)

    def extend(
        self,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        new_messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
    ) -> JoinedIds | None:
        return None
