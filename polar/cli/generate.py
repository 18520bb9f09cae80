"""``polar generate``: one chat turn through the configured backend (render, generate, parse), printed as JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING, Any

from polar.settings import get_settings

if TYPE_CHECKING:
    from polar.settings import Settings


async def generate_reply(settings: Settings, text: str, max_new_tokens: int, temperature: float) -> dict[str, Any]:
    """The turn's prompt and output ids, logprobs, finish reason, weight version and parsed reply (hermes)."""
    # Imported here, not at the top: every ``polar`` command builds this module's parser, only this one renders.
    from polar.backends.registry import make_backend
    from polar.inference import GenerateRequest, SamplingParams
    from polar.model_folder import folder_tokenizer
    from polar.models.resolve import ModelChoice, resolve_model_folder
    from polar.tokens.messages import user
    from polar.tokens.parsers import get_format
    from polar.tokens.render import PromptBuilder

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


def _generate(args: argparse.Namespace) -> None:
    print(
        json.dumps(
            asyncio.run(generate_reply(get_settings(), args.prompt, args.max_new_tokens, args.temperature)), indent=1
        )
    )


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    gen = sub.add_parser("generate", help="one chat turn through the configured backend, printed as JSON")
    gen.add_argument("prompt")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=1.0)
    gen.set_defaults(func=_generate)
