"""Our chat template, in the Qwen2.5 / Hermes family (ChatML turns, tools in the system turn,
``<tool_call>`` blocks, ``<tool_response>`` results, ``<think>`` reasoning).

It is written in Python rather than Jinja because append mode needs to render *part* of a conversation:
every message renders on its own (consecutive tool results share one user turn), so the text of
``messages[k:]`` after an assistant turn is exactly the tail of the full render. Reasoning is kept in every
assistant turn (Qwen3's template drops old reasoning; keeping it is what makes append mode and canonical
mode agree).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from polar.errors import TemplateError
from polar.tokens.messages import Message, Role, ToolSpec
from polar.tokens.parsers import get_format
from polar.tokens.tokenizer import IM_END, IM_START, ChatTokenizer

GENERATION_PROMPT = f"{IM_START}assistant\n"

_TOOL_INSTRUCTIONS = {
    "hermes": (
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    ),
    "qwen3_coder": (
        "For each function call, write it within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        "<function=FUNCTION_NAME>\n<parameter=PARAMETER_NAME>\nVALUE\n</parameter>\n</function>\n</tool_call>"
    ),
}


def _turn(role: str, body: str) -> str:
    return f"{IM_START}{role}\n{body}{IM_END}\n"


@dataclass(frozen=True)
class ChatTemplate:
    """Renders canonical messages to text. ``tool_format`` picks the tool-call block syntax."""

    tool_format: str = "hermes"

    def __post_init__(self) -> None:
        get_format(self.tool_format)  # fail early on an unknown format

    def render(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, add_generation_prompt: bool = True
    ) -> str:
        """The whole prompt text.

        With ``add_generation_prompt`` the text ends with the assistant header, or, when the conversation
        ends with an assistant message, with that message left open (a prefill). Without it every turn is
        closed (a finished conversation, e.g. for SFT export).
        """
        head = ""
        rest = list(messages)
        if rest and rest[0].role is Role.SYSTEM:
            head = self.system_turn(rest.pop(0).content, tools)
        elif tools:
            head = self.system_turn("", tools)
        return head + self.render_tail(rest, add_generation_prompt=add_generation_prompt)

    def render_tail(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
        """Messages that follow earlier turns (no tool header). Ends with the generation prompt."""
        parts: list[str] = []
        for i, message in enumerate(messages):
            last = i == len(messages) - 1
            if message.role is Role.TOOL:
                first_in_group = i == 0 or messages[i - 1].role is not Role.TOOL
                last_in_group = last or messages[i + 1].role is not Role.TOOL
                parts.append(self._tool_result(message, first_in_group, last_in_group))
            elif message.role is Role.ASSISTANT:
                if last and add_generation_prompt:  # a trailing assistant message is a prefill: left open
                    parts.append(GENERATION_PROMPT + self.assistant_body(message))
                    return "".join(parts)
                parts.append(_turn("assistant", self.assistant_body(message)))
            elif message.role in (Role.USER, Role.SYSTEM):
                parts.append(_turn(message.role.value, message.content))
            else:  # pragma: no cover - Role is closed, kept for a clear message if it grows
                raise TemplateError(f"unknown role {message.role!r}", field="role")
        if add_generation_prompt:
            parts.append(GENERATION_PROMPT)
        return "".join(parts)

    def following_ids(
        self, tokenizer: ChatTokenizer, output_ids: Sequence[int], messages: Sequence[Message]
    ) -> array[int]:
        """The ids that follow a reply of ``output_ids`` when ``messages`` come after it: the end-of-turn the reply
        lacked (the backend stopped before it, or at max tokens), then the "\\n" the template puts after every
        end-of-turn, then the messages' render (``render_tail``)."""
        end = tokenizer.im_end_id
        ids = array("i", [] if output_ids and output_ids[-1] == end else [end])
        ids.extend(tokenizer.encode("\n" + self.render_tail(messages)))
        return ids

    def system_turn(self, system_text: str, tools: Sequence[ToolSpec]) -> str:
        if not tools:
            return _turn("system", system_text)
        lines = "\n".join(json.dumps(tool.as_json(), ensure_ascii=False) for tool in tools)
        header = f"{system_text}\n\n" if system_text else ""
        return _turn(
            "system",
            f"{header}# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML "
            f"tags:\n<tools>\n{lines}\n</tools>\n\n"
            f"{_TOOL_INSTRUCTIONS[self.tool_format]}",
        )

    def assistant_body(self, message: Message) -> str:
        """What the model would sample for this message, without the end-of-turn token."""
        body = f"<think>\n{message.reasoning}\n</think>\n\n" if message.reasoning else ""
        body += message.content
        render_call = get_format(self.tool_format).render_tool_call
        for i, call in enumerate(message.tool_calls):
            body += ("\n" if i > 0 or message.content else "") + render_call(call)
        return body

    @staticmethod
    def _tool_result(message: Message, first: bool, last: bool) -> str:
        text = (f"{IM_START}user" if first else "") + f"\n<tool_response>\n{message.content}\n</tool_response>"
        return text + (f"{IM_END}\n" if last else "")
