"""``BackendChat``: one chat turn with the configured backend (``POLAR_BACKEND``), for LLM judges.

It renders with the judge model's chat format (its family, polar.chat), generates from token ids like the
gateway does, and returns the reply's text (reasoning and tool-call markup parsed out). The backend is
connected on first use and kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from polar.settings import Settings

if TYPE_CHECKING:
    from polar.chat import ChatFormat
    from polar.inference import Backend


class BackendChat:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._parts: tuple[ChatFormat, Backend] | None = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> tuple[ChatFormat, Backend]:
        async with self._lock:
            if self._parts is None:
                from polar.backends.registry import make_backend
                from polar.chat import chat_format_for
                from polar.models.check import checked_model
                from polar.models.resolve import ModelChoice, judge_settings

                folder, _tokenizer = await asyncio.to_thread(checked_model, ModelChoice.judge(self.settings))
                fmt = await asyncio.to_thread(chat_format_for, folder, self.settings.chat_format)
                backend = await make_backend(judge_settings(self.settings))
                self._parts = (fmt, backend)
            return self._parts

    async def complete(self, messages: Sequence[tuple[str, str]], *, max_tokens: int, temperature: float) -> str:
        from polar.inference import GenerateRequest, SamplingParams
        from polar.tokens.messages import Message, Role

        fmt, backend = await self._connect()
        prompt = fmt.render_ids([Message(Role(role), content) for role, content in messages])
        budget = max(1, min(max_tokens, backend.context_length - len(prompt)))
        result = await backend.generate(
            GenerateRequest(tuple(prompt), SamplingParams(max_new_tokens=budget, temperature=temperature))
        )
        return str(fmt.parse(result.output_ids, (), prompt).content)

    async def aclose(self) -> None:
        if self._parts is not None:
            await self._parts[1].aclose()
            self._parts = None
