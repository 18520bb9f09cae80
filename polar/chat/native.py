"""ChatFormat over our own ChatML code (polar/tokens/template.py): Qwen3 (Hermes JSON calls) and Qwen3-Coder.

Kept beside the renderers library for one reason the library does not give: our template keeps reasoning in
every assistant turn, so its renders are prefix-stable and append mode equals a canonical render on every
turn (the library's Qwen3 renderer follows Qwen3's own template, which drops earlier turns' reasoning, and
declares itself not prefix-stable). tests/chat checks that the two render byte-identical ids for Qwen3 on
conversations where Qwen3's template keeps everything.
"""

from __future__ import annotations

from collections.abc import Sequence

from polar.tokens.detokenize import IncrementalDecoder
from polar.tokens.lazy_ids import JoinedIds
from polar.tokens.messages import Message, ToolSpec
from polar.tokens.parsers import get_format
from polar.tokens.parsers.stream import StreamParser
from polar.tokens.parsers.types import Event, ParsedOutput
from polar.tokens.template import ChatTemplate
from polar.tokens.tokenizer import ChatTokenizer


class TextStream:
    """A streamed turn decoded incrementally (never half a UTF-8 character) and parsed as text."""

    def __init__(self, tokenizer: ChatTokenizer, parser: StreamParser):
        self._decoder = IncrementalDecoder(tokenizer)
        self._parser = parser

    @property
    def reasoning_opened(self) -> bool:
        return bool(self._parser.reasoning_opened)

    def feed(self, ids: Sequence[int]) -> list[Event]:
        return list(self._parser.feed(self._decoder.feed(ids)))

    def finish(self) -> list[Event]:
        return [*self._parser.feed(self._decoder.flush()), *self._parser.finish()]


class NativeFormat:
    prefix_stable = True

    def __init__(self, family: str, tokenizer: ChatTokenizer, tool_format: str = "hermes"):
        """``tool_format``: the polar.tokens.parsers format of the family's tool calls."""
        self.family = family
        self.tokenizer = tokenizer
        self.template = ChatTemplate(tool_format)
        self.tool_format = get_format(tool_format)

    @property
    def stop_ids(self) -> frozenset[int]:
        return self.tokenizer.eos_ids

    def render_ids(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, add_generation_prompt: bool = True
    ) -> Sequence[int]:
        text = self.template.render(messages, tools, add_generation_prompt=add_generation_prompt)
        return self.tokenizer.encode_rendered(text)

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
    ) -> JoinedIds:
        """The earlier ids kept as they are (``JoinedIds``: never copied), then what follows them
        (``ChatTemplate.following_ids``)."""
        added = self.template.following_ids(self.tokenizer, output_ids, new_messages)
        return JoinedIds(JoinedIds(prompt_ids, output_ids), added)

    def stream_parser(self, tools: Sequence[ToolSpec] = (), prompt_ids: Sequence[int] | None = None) -> TextStream:
        return TextStream(self.tokenizer, self.tool_format.stream_parser(tools=tools or None))

    def reply_ids(self, message: Message) -> list[int]:
        return [*self.tokenizer.encode(self.template.assistant_body(message)), self.tokenizer.im_end_id]
