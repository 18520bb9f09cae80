"""ChatFormat over our own ChatML code (polar/tokens/template.py): Qwen3 (Hermes JSON calls) and Qwen3-Coder.

Kept beside the renderers library for one reason the library does not give: our template keeps reasoning in
every assistant turn, so its renders are prefix-stable and append mode equals a canonical render on every
turn (the library's Qwen3 renderer follows Qwen3's own template, which drops earlier turns' reasoning, and
declares itself not prefix-stable). tests/chat checks that the two render byte-identical ids for Qwen3 on
conversations where Qwen3's template keeps everything.
"""

from __future__ import annotations

from collections.abc import Sequence

from polar.tokens.messages import Message, ToolSpec
from polar.tokens.parsers import get_format
from polar.tokens.parsers.types import ParsedOutput
from polar.tokens.template import ChatTemplate
from polar.tokens.tokenizer import ChatTokenizer

TOOL_FORMATS = {"qwen3": "hermes", "qwen3_coder": "qwen3_coder"}


class NativeFormat:
    prefix_stable = True

    def __init__(self, family: str, tokenizer: ChatTokenizer):
        self.family = family
        self.tokenizer = tokenizer
        self.template = ChatTemplate(TOOL_FORMATS[family])
        self.tool_format = get_format(TOOL_FORMATS[family])

    @property
    def stop_ids(self) -> frozenset[int]:
        return self.tokenizer.eos_ids

    def render_ids(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, add_generation_prompt: bool = True
    ) -> list[int]:
        return self.tokenizer.encode(self.template.render(messages, tools, add_generation_prompt=add_generation_prompt))

    def parse(
        self, output_ids: Sequence[int], tools: Sequence[ToolSpec] = (), prompt_ids: Sequence[int] | None = None
    ) -> ParsedOutput:
        text = self.tokenizer.decode(list(output_ids), skip_special_tokens=True)
        return self.tool_format.parse(text, tools or None)

    def extend(
        self,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        new_messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
    ) -> list[int] | None:
        end = self.tokenizer.im_end_id
        glue = [] if output_ids and output_ids[-1] == end else [end]
        # The template puts "\n" after every end-of-turn; it opens the new text.
        tail = self.tokenizer.encode("\n" + self.template.render_tail(list(new_messages)))
        return [*prompt_ids, *output_ids, *glue, *tail]
