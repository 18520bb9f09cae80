"""ChatFormat over the ``renderers`` library (hand-written renderers and token-level parsers per family).

Our canonical messages and tool specs are converted to the library's OpenAI-style dicts; its
``ParsedResponse`` to our ParsedOutput (calls with status OK become calls, every other attempt a
MalformedToolCall whose text stays in the content); ``extend`` is its ``bridge_to_next_turn``, which keeps the
sampled ids verbatim and returns None where it cannot prove the result equals a canonical render. The library is
handed only a prompt's last turn (``LibraryFormat.prompt_tail``), so a turn of a long session costs its new ids.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from polar.chat.protocol import ReparseStreamParser
from polar.chat.reply import reply_by_render
from polar.errors import ConfigError, InvalidRequest
from polar.ids import random_hex
from polar.tokens.lazy_ids import JoinedIds, LazyIds, int32
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec
from polar.tokens.parsers.types import MalformedToolCall, ParsedOutput

if TYPE_CHECKING:
    from polar.chat.families import Family

_TAIL_IDS = 4096  # a prompt's last ids read first for its last stop id (then 8x as many, until found)


def message_dict(message: Message) -> dict[str, Any]:
    item: dict[str, Any] = {"role": message.role.value, "content": message.content}
    if message.reasoning:
        item["reasoning_content"] = message.reasoning
    if message.tool_calls:
        item["tool_calls"] = [
            {
                "id": call.id or f"call_{i}",
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call)},
            }
            for i, call in enumerate(message.tool_calls)
        ]
    if message.role is Role.TOOL:
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        if message.name:
            item["name"] = message.name
    return item


def _arguments(call: ToolCall) -> Any:
    value = call.parsed_arguments()
    return value if isinstance(value, dict) else call.arguments


def tool_dict(tool: ToolSpec) -> dict[str, Any]:
    return tool.as_json()


def merge_leading_system(messages: Sequence[Message]) -> list[Message]:
    """The conversation with its leading system messages joined (blank line between) into one."""
    n = 0
    while n < len(messages) and messages[n].role is Role.SYSTEM:
        n += 1
    if n < 2:
        return list(messages)
    return [Message(Role.SYSTEM, "\n\n".join(m.content for m in messages[:n])), *messages[n:]]


class LibraryFormat:
    """A family rendered and parsed by ``renderers``; ``hf_tokenizer`` is the model folder's fast tokenizer."""

    def __init__(
        self,
        family: str,
        renderer_name: str,
        hf_tokenizer: Any,
        *,
        calls_delimited: bool = True,
        reply_config: Mapping[str, Any] | None = None,
    ):
        """``reply_config``: renderer settings for writing scripted replies (one that keeps a final turn's
        reasoning, where the family's history render drops it: gpt-oss's ``auto_drop_analysis``)."""
        import renderers

        self.family = family
        config = renderers.config_from_name(renderer_name)
        try:
            self._renderer = renderers.create_renderer(hf_tokenizer, config)
            self._reply_renderer = (
                renderers.create_renderer(hf_tokenizer, config.model_copy(update=dict(reply_config)))
                if reply_config and config is not None
                else self._renderer
            )
        except Exception as exc:
            raise ConfigError(
                f"the {family} chat format cannot be built on tokenizer {getattr(hf_tokenizer, 'name_or_path', '?')}:"
                f" {exc}",
                field="chat_format",
            ) from exc
        self._tokenizer = hf_tokenizer
        self._renderer_name = renderer_name
        self.calls_delimited = calls_delimited

    @classmethod
    def from_folder(cls, family: str, renderer_name: str, folder_path: Path, name: str) -> LibraryFormat:
        """The renderer ``renderer_name`` on the folder's tokenizer, as family ``family`` (any registered one)."""
        from polar.chat.families import Family

        return cls.from_family(Family(family, "", renderer_name), folder_path, name)

    @classmethod
    def from_family(cls, family: Family, folder_path: Path, name: str) -> LibraryFormat:
        from transformers import PreTrainedTokenizerFast

        if family.harmony_vocab:
            from polar.settings import get_settings
            from polar.tokens.vocabularies import ensure_harmony_vocab

            ensure_harmony_vocab(get_settings().cache_dir)
        tok = PreTrainedTokenizerFast.from_pretrained(str(folder_path))
        tok.name_or_path = name
        assert family.renderer is not None
        return cls(
            family.name,
            family.renderer,
            tok,
            calls_delimited=family.calls_delimited,
            reply_config=dict(family.reply_config),
        )

    @property
    def prefix_stable(self) -> bool:
        return bool(self._renderer.is_prefix_stable)

    @property
    def stop_ids(self) -> frozenset[int]:
        return frozenset(self._renderer.get_stop_token_ids())

    def render_ids(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, add_generation_prompt: bool = True
    ) -> list[int]:
        """The canonical render. A family whose template takes one system message (Llama 3) gets the leading
        system messages joined into one (agent CLIs send two: instructions and a developer message); a
        conversation the family cannot render is an InvalidRequest naming why, never a 500."""
        try:
            return self._render(messages, tools, add_generation_prompt)
        except (ValueError, TypeError, KeyError) as exc:
            merged = merge_leading_system(messages)
            if len(merged) < len(messages):
                try:
                    return self._render(merged, tools, add_generation_prompt)
                except (ValueError, TypeError, KeyError):
                    pass
            raise InvalidRequest(
                f"messages: the {self.family} chat format cannot render this conversation: {exc}", field="messages"
            ) from exc

    def _render(self, messages: Sequence[Message], tools: Sequence[ToolSpec], add_generation_prompt: bool) -> list[int]:
        return list(
            self._renderer.render_ids(
                [message_dict(m) for m in messages],
                tools=[tool_dict(t) for t in tools] or None,
                add_generation_prompt=add_generation_prompt,
            )
        )

    def parse(
        self, output_ids: Sequence[int], tools: Sequence[ToolSpec] = (), prompt_ids: Sequence[int] | None = None
    ) -> ParsedOutput:
        try:
            parsed = self._renderer.parse_response(
                list(output_ids),
                tools=[tool_dict(t) for t in tools] or None,
                prompt_ids=None if prompt_ids is None else self.prompt_tail(prompt_ids),
            )
        except Exception as exc:  # noqa: BLE001 - never crash on model output: keep the text, invent nothing
            text = self._tokenizer.decode(list(output_ids), skip_special_tokens=True)
            return ParsedOutput(text, None, (), (MalformedToolCall(text, f"unparsable output: {exc}"),))
        calls: list[ToolCall] = []
        malformed: list[MalformedToolCall] = []
        content = parsed.content or ""
        for attempt in parsed.tool_calls:
            ok = attempt.status.value == "ok" and attempt.name
            if ok:
                args = attempt.arguments
                text = json.dumps(args, ensure_ascii=False) if isinstance(args, dict) else str(args or "{}")
                calls.append(ToolCall(str(attempt.name), text, attempt.id or f"call_{random_hex(12)}"))
            else:
                malformed.append(MalformedToolCall(attempt.raw, attempt.status.value))
                if attempt.raw and attempt.raw not in content:
                    content += attempt.raw
        return ParsedOutput(content, parsed.reasoning_content, tuple(calls), tuple(malformed))

    def extend(
        self,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        new_messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
    ) -> JoinedIds | None:
        """The library's ``bridge_to_next_turn`` on the prompt's last turn (``prompt_tail``): ``prompt_ids`` (that
        very object, never copied) followed by the output as the bridge kept or closed it and the new ids."""
        tail = self.prompt_tail(prompt_ids)
        try:
            bridged = self._renderer.bridge_to_next_turn(
                tail,
                list(output_ids),
                [message_dict(m) for m in new_messages],
                tools=[tool_dict(t) for t in tools] or None,
            )
        except (ValueError, TypeError, KeyError):  # what it cannot bridge is rendered canonically
            return None
        if bridged is None or bridged.token_ids[: len(tail)] != tail:  # it keeps the prompt as it was given
            return None
        return JoinedIds(prompt_ids, bridged.token_ids[len(tail) :])

    def prompt_tail(self, prompt_ids: Sequence[int]) -> list[int]:
        """The prompt from its last stop id on (all of it when it has none): all that the library reads of a prompt.
        Its bridges keep the ids they are given as they are and read them only past the last turn's close (the
        reasoning scan after the last stop id; gpt-oss's generation header, after its last ``<|start|>``, which
        follows it). A session's prompt is then read only at its end, never whole (tests/chat checks that the
        tail and the whole prompt give the same ids and parses on every family)."""
        ids = prompt_ids if isinstance(prompt_ids, LazyIds) else int32(prompt_ids)  # a list: converted once
        n, size = len(ids), _TAIL_IDS
        marks = np.fromiter(self.stop_ids, np.int32)
        while True:
            start = max(n - size, 0)
            tail = np.frombuffer(int32(ids[start:n]), np.int32)
            hits = np.flatnonzero(np.isin(tail, marks))
            if hits.size or start == 0:
                found: list[int] = tail[int(hits[-1]) if hits.size else 0 :].tolist()
                return found
            size *= 8

    def stream_parser(
        self, tools: Sequence[ToolSpec] = (), prompt_ids: Sequence[int] | None = None
    ) -> ReparseStreamParser:
        return ReparseStreamParser(self, tools, None if prompt_ids is None else self.prompt_tail(prompt_ids))

    def reply_ids(self, message: Message) -> list[int]:
        def render(messages: Sequence[Message], *, add_generation_prompt: bool = True) -> list[int]:
            dicts = [message_dict(m) for m in messages]
            return list(self._reply_renderer.render_ids(dicts, add_generation_prompt=add_generation_prompt))

        return reply_by_render(
            render,
            self.stop_ids,
            message,
            lambda ids: self._tokenizer.decode(ids, skip_special_tokens=False),
            lambda text: list(self._tokenizer.encode(text, add_special_tokens=False)),
            self.family,
        )
