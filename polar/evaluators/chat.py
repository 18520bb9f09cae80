"""``BackendChat``: one chat turn with the configured backend (``POLAR_BACKEND``), for LLM judges.

It renders with our chat template, generates from token ids like the gateway does, and returns the reply's
text (reasoning and tool-call markup parsed out). The backend is connected on first use and kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from polar.settings import Settings


class BackendChat:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._parts: tuple | None = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> tuple:
        async with self._lock:
            if self._parts is None:
                from polar.backends.registry import make_backend
                from polar.chat.families import require_served_family
                from polar.models.check import checked_model
                from polar.models.resolve import ModelChoice, judge_settings
                from polar.tokens.parsers import get_format
                from polar.tokens.render import PromptBuilder

                folder, tokenizer = await asyncio.to_thread(checked_model, ModelChoice.judge(self.settings))
                require_served_family(folder, self.settings.chat_format)
                backend = await make_backend(judge_settings(self.settings))
                self._parts = (tokenizer, PromptBuilder(tokenizer), get_format(self.settings.tool_format), backend)
            return self._parts

    async def complete(self, messages: Sequence[tuple[str, str]], *, max_tokens: int, temperature: float) -> str:
        from polar.backends.base import GenerateRequest, SamplingParams
        from polar.tokens.messages import Message, Role

        tokenizer, builder, parser, backend = await self._connect()
        prompt = builder.build([Message(Role(role), content) for role, content in messages])
        budget = max(1, min(max_tokens, backend.context_length - len(prompt.ids)))
        result = await backend.generate(
            GenerateRequest(prompt.ids, SamplingParams(max_new_tokens=budget, temperature=temperature))
        )
        return parser.parse_ids(tokenizer, result.output_ids).content

    async def aclose(self) -> None:
        if self._parts is not None:
            await self._parts[3].aclose()
            self._parts = None
