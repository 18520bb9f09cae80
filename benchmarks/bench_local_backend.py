"""Local backend throughput, next to Hugging Face ``generate`` on the same model in the same run.

Both decode 256 new tokens from the same 200-token chat prompt with one torch thread; the local backend
also returns one logprob per token (SGLang semantics) and runs each step on its engine thread.

    .venv/bin/python benchmarks/bench_local_backend.py [--model tiny|tiny-qwen] [--tokens 256]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch

from polar.backends.local import LocalBackend
from polar.inference import GenerateRequest, SamplingParams
from polar.settings import get_settings
from polar.tokens.messages import system, user
from polar.tokens.render import PromptBuilder


def hf_generate_tps(model, ids: tuple[int, ...], tokens: int, temperature: float) -> float:
    inputs = torch.tensor([ids])
    kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
    started = time.perf_counter()
    with torch.no_grad():
        model.generate(
            inputs,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            output_logits=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    return tokens / (time.perf_counter() - started)


async def backend_tps(
    backend: LocalBackend, ids: tuple[int, ...], tokens: int, temperature: float, concurrent: int = 1
) -> float:
    params = SamplingParams(max_new_tokens=tokens, temperature=temperature, ignore_eos=True, seed=0)
    started = time.perf_counter()
    results = await asyncio.gather(*(backend.generate(GenerateRequest(ids, params)) for _ in range(concurrent)))
    return sum(len(r.output_ids) for r in results) / (time.perf_counter() - started)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    settings = get_settings()
    backend = LocalBackend.from_spec(args.model, settings.cache_dir, threads=1)
    builder = PromptBuilder(backend.engine.tokenizer)
    ids = builder.build([system("You are a coding agent. " * 20), user("Write a function that sorts a list.")]).ids
    model = backend.engine.model
    model.generation_config.pad_token_id = backend.engine.tokenizer.end_of_text_id
    print(
        f"model={args.model} prompt={len(ids)} tokens, {args.tokens} new tokens, 1 torch thread, median of "
        f"{args.repeat}"
    )
    print(f"{'case':<24} {'polar local tok/s':>18} {'HF generate tok/s':>18} {'ratio':>6}")
    for name, temperature in (("greedy", 0.0), ("sampled T=1.0", 1.0)):
        ours = statistics.median(
            [await backend_tps(backend, ids, args.tokens, temperature) for _ in range(args.repeat)]
        )
        theirs = statistics.median([hf_generate_tps(model, ids, args.tokens, temperature) for _ in range(args.repeat)])
        print(f"{name:<24} {ours:>18.0f} {theirs:>18.0f} {ours / theirs:>5.2f}x")
    together = statistics.median(
        [await backend_tps(backend, ids, args.tokens, 1.0, concurrent=4) for _ in range(args.repeat)]
    )
    print(f"{'4 concurrent, sampled':<24} {together:>18.0f} {'(aggregate)':>18}")
    await backend.aclose()


if __name__ == "__main__":
    asyncio.run(main())
