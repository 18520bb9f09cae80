"""The ids a model of a family samples for a given assistant turn, read off the family's own render.

Scripted policies (tests, demos) answer with written replies; to keep captures true token ids, a reply is the
tail a canonical render adds after the generation prompt, through its last stop id (a template's separator
after the stop is not sampled). Where the generation prompt opens a channel the history render writes
differently (Qwen3.5's ``<think>\\n``, gpt-oss's analysis channel), the tail is taken at the text level, and a
reply without reasoning gets ``SCRIPTED_REASONING`` when the family's turn cannot start without some.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from polar.errors import ConfigError
from polar.tokens.messages import Message, Role

PROBE = (Message(Role.USER, "Go on."),)
SCRIPTED_REASONING = "The script says what to do."


def through_last_stop(ids: Sequence[int], stops: frozenset[int]) -> list[int]:
    """``ids`` up to and including the last stop id; one stop id appended when there is none."""
    for index in range(len(ids) - 1, -1, -1):
        if ids[index] in stops:
            return list(ids[: index + 1])
    return [*ids, min(stops)] if stops else list(ids)


Render = Callable[..., Sequence[int]]  # render_ids(messages, *, add_generation_prompt=...)


def reply_by_render(
    render: Render,
    stops: frozenset[int],
    message: Message,
    decode: Callable[[list[int]], str],
    encode: Callable[[str], list[int]],
    family: str,
) -> list[int]:
    """``message`` as the family samples it: ``render`` is the family's ``render_ids`` (one that keeps the
    reply's reasoning), ``decode`` keeps special tokens."""
    prompt = render(list(PROBE))
    candidates = [message]
    if not message.reasoning:
        candidates.append(dataclasses.replace(message, reasoning=SCRIPTED_REASONING))
    for candidate in candidates:
        full = render([*PROBE, candidate], add_generation_prompt=False)
        if full[: len(prompt)] == prompt:
            return through_last_stop(full[len(prompt) :], stops)
        prompt_text, full_text = decode(list(prompt)), decode(list(full))
        if full_text.startswith(prompt_text):
            return through_last_stop(encode(full_text[len(prompt_text) :]), stops)
    raise ConfigError(
        f"the {family} chat format renders no assistant turn after its own generation prompt; scripted replies "
        "cannot be written for it",
        field="chat_format",
    )
