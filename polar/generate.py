"""One chat turn through the configured backend (``polar generate``): render, generate, parse."""

from __future__ import annotations

from typing import Any

from polar.backends.registry import make_backend
from polar.inference import GenerateRequest, SamplingParams
from polar.models.folder import folder_tokenizer
from polar.models.resolve import ModelChoice, resolve_model_folder
from polar.settings import Settings
from polar.tokens.messages import user
from polar.tokens.parsers import get_format
from polar.tokens.render import PromptBuilder


async def generate_reply(settings: Settings, text: str, max_new_tokens: int, temperature: float) -> dict[str, Any]:
    tokenizer = folder_tokenizer(resolve_model_folder(ModelChoice.policy(settings)))
    prompt = PromptBuilder(tokenizer).build([user(text)])
    backend = await make_backend(settings)
    try:
        result = await backend.generate(
            GenerateRequest(prompt.ids, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature))
        )
    finally:
        await backend.aclose()
    parsed = get_format("hermes").parse_ids(tokenizer, result.output_ids)
    return {
        "backend": backend.name,
        "prompt_ids": list(prompt.ids),
        "output_ids": list(result.output_ids),
        "output_logprobs": list(result.output_logprobs),
        "finish_reason": result.finish_reason.value,
        "weight_version": result.weight_version,
        "content": parsed.content,
        "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in parsed.tool_calls],
    }
