"""Next-token sampling with SGLang's pipeline and logprob semantics.

Order (sglang/srt/layers/sampler.py): temperature, then top-k, top-p, min-p truncation, then a draw.
The logprob reported for the chosen id is taken before truncation:
- TEMPERATURE_SCALED (SGLang default): log_softmax(logits / T) when sampling, log_softmax(logits) when greedy;
- RAW (vLLM's raw_logprobs, SGLANG_RETURN_ORIGINAL_LOGPROB=1): log_softmax(logits) always.
"""

from __future__ import annotations

from typing import Any

import torch

from polar.inference import LogprobSemantics, SamplingParams


def sample_next(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    semantics: LogprobSemantics = LogprobSemantics.TEMPERATURE_SCALED,
) -> tuple[int, float]:
    """Choose the next id from one row of fp32 logits; return (id, logprob)."""
    logits = logits.float()
    raw = torch.log_softmax(logits, dim=-1)
    if params.greedy:
        token = int(torch.argmax(logits))
        return token, float(raw[token])
    scaled = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = scaled.exp()
    if params.top_k > 0 and params.top_k < probs.numel():
        kth = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep the smallest head whose mass reaches top_p (the first token is always kept).
        drop = (cumulative - sorted_probs) > params.top_p * cumulative[-1]
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if params.min_p > 0.0:
        probs = torch.where(probs >= params.min_p * probs.max(), probs, torch.zeros_like(probs))
    token = int(torch.multinomial(probs / probs.sum(), 1, generator=generator))
    chosen = scaled if semantics is LogprobSemantics.TEMPERATURE_SCALED else raw
    return token, float(chosen[token])


def rescore(
    model: Any, ids: list[int], prompt_len: int, temperature: float, semantics: LogprobSemantics
) -> list[float]:
    """Teacher-forced logprobs of ids[prompt_len:] in one forward pass, with the given semantics."""
    keep = len(ids) - prompt_len + 1  # only the positions that predict ids[prompt_len:] (and one past)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), logits_to_keep=keep).logits[0, :-1].float()
    if semantics is LogprobSemantics.TEMPERATURE_SCALED and temperature >= 1e-6:
        logits = logits / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    targets = torch.tensor(ids[prompt_len:])
    return logprobs.gather(1, targets[:, None])[:, 0].tolist()
