"""TRL's truncated importance sampling on Polar rollouts is computed from the stored behaviour logprobs.

TRL 1.16's ``GRPOTrainer`` is built on the tiny model with ``PolarRolloutFunc`` reading stored trajectories whose
``response_logprobs`` are the trainer's own fp32 recompute minus known deltas (``tests.integrations.behaviour``).
Its ``_generate_and_score_completions`` (the step that calls the rollout_func, recomputes ``old_per_token_logps``
and builds the loss inputs) must then give every sampled token the weight ``min(exp(delta), cap)`` (token mode)
or every sequence ``min(exp(sum delta), cap)`` (sequence mode), and weight 1 to inserted and padding tokens, which
the loss mask drops. Without ``enable_importance_sampling`` TRL keeps the logprobs but applies no weight.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from polar.errors import InvalidRequest
from polar.integrations.trl import PolarRolloutFunc, enable_importance_sampling, polar_reward
from polar.tokens.tokenizer import vocab_fingerprint
from tests.integrations.behaviour import (
    CAP,
    FakeControlAPI,
    Stored,
    build,
    sampled_at,
    sequence_weight,
    token_weight,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*gradient_checkpointing:FutureWarning"),
    pytest.mark.filterwarnings("ignore:You are using 'rollout_func':UserWarning"),
]

SHAPES = [(9, 5, 3, 4), (6, 3, 0, 0), (11, 2, 4, 6)]  # (prompt, sampled, inserted, sampled): ragged on purpose
TOLERANCE = 1e-4  # TRL's padded-batch recompute vs the unpadded one the deltas were taken from (~1e-6 apart)


@pytest.fixture(scope="module")
def stored(tiny_model_dir: Path) -> list[Stored]:
    return build(tiny_model_dir, SHAPES)


def make_trainer(model_dir: Path, stored: list[Stored], tmp_path: Path, mode: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from datasets import Dataset  # type: ignore[attr-defined]  # mypy sees the repo's datasets/ folder

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    client = FakeControlAPI(stored, vocab_fingerprint(tokenizer.get_vocab()))
    rollout = PolarRolloutFunc(client, tokenizer, {"harness": {"name": "agent"}})  # type: ignore[arg-type]
    n = len(stored)
    config = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=n,
        num_generations=n,
        num_generations_eval=n,
        max_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_max=CAP,
    )
    return GRPOTrainer(
        model=model,
        reward_funcs=polar_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["p"] * n}),
        processing_class=tokenizer,
        rollout_func=rollout,
    )


def generate(trainer: Any, n: int) -> dict[str, Any]:
    out: dict[str, Any] = trainer._generate_and_score_completions([{"prompt": "p"}] * n)
    return out


def test_token_truncated_weights_come_from_the_stored_behaviour_logprobs(tiny_model_dir, stored, tmp_path):
    trainer = make_trainer(tiny_model_dir, stored, tmp_path, "token_truncate")
    before = generate(trainer, len(stored))
    # TRL keeps the stored logprobs as its sampling logprobs, token for token...
    for i, s in enumerate(stored):
        got = before["sampling_per_token_logps"][i, : len(s.response_ids)].tolist()
        assert got == pytest.approx(s.response_logprobs, abs=1e-6)
    # ...but without use_vllm it applies no correction: the gap this module's enable_importance_sampling closes.
    assert "importance_sampling_ratio" not in before

    assert enable_importance_sampling(trainer) is trainer
    out = generate(trainer, len(stored))
    ratio, old, mask = out["importance_sampling_ratio"], out["old_per_token_logps"], out["tool_mask"]
    assert ratio.shape == old.shape
    for i, s in enumerate(stored):
        n = len(s.response_ids)
        # TRL's own recompute is the trainer's logprob the deltas were taken from.
        assert old[i, :n].tolist() == pytest.approx(s.recompute, abs=TOLERANCE)
        assert mask[i, :n].tolist() == s.loss_mask
        expected = [token_weight(d) if m else 1.0 for d, m in zip(s.deltas, s.loss_mask, strict=True)]
        assert ratio[i, :n].tolist() == pytest.approx(expected, rel=TOLERANCE)
        assert ratio[i, n:].tolist() == [1.0] * (ratio.shape[1] - n)  # padding: no correction
    clipped = [d for s in stored for d, m in zip(s.deltas, s.loss_mask, strict=True) if m and math.exp(d) > CAP]
    assert clipped and float(ratio.max()) == pytest.approx(CAP)  # the cap was reached and held


def test_sequence_truncated_weight_is_the_capped_product_over_sampled_tokens(tiny_model_dir, stored, tmp_path):
    trainer = enable_importance_sampling(make_trainer(tiny_model_dir, stored, tmp_path, "sequence_truncate"))
    out = generate(trainer, len(stored))
    ratio = out["importance_sampling_ratio"]
    assert tuple(ratio.shape) == (len(stored), 1)
    expected = [sequence_weight(d for d, m in zip(s.deltas, s.loss_mask, strict=True) if m) for s in stored]
    assert ratio[:, 0].tolist() == pytest.approx(expected, rel=TOLERANCE)
    assert any(w == CAP for w in expected) and any(w < CAP for w in expected)


def test_enable_importance_sampling_refuses_what_it_cannot_correct(tiny_model_dir, stored, tmp_path):
    trainer = make_trainer(tiny_model_dir, stored, tmp_path, "token_truncate")
    trainer.vllm_importance_sampling_correction = False
    with pytest.raises(InvalidRequest, match="vllm_importance_sampling_correction=False"):
        enable_importance_sampling(trainer)
    trainer.vllm_importance_sampling_correction = True
    trainer.rollout_func = lambda prompts, trainer: {}
    with pytest.raises(InvalidRequest, match="PolarRolloutFunc"):
        enable_importance_sampling(trainer)


def _cooled(s: Stored) -> Stored:
    """``s`` with its second run of sampled ids sampled at temperature 0.3 (a mixed trace), if it has one."""
    spans = sampled_at(s.loss_mask, 1.0)
    if len(spans) > 1:
        spans[1]["temperature"] = 0.3
    return replace(s, sampling_spans=spans)


def test_tokens_sampled_at_another_temperature_are_masked_once_the_logprobs_are_weighed(
    tiny_model_dir, stored, tmp_path
):
    mixed = [_cooled(s) for s in stored]
    trainer = make_trainer(tiny_model_dir, mixed, tmp_path, "token_truncate")
    before = generate(trainer, len(mixed))
    # TRL does not weigh the stored logprobs yet: every sampled token trains, the spans travel along.
    assert [before["tool_mask"][i, : len(s.response_ids)].tolist() for i, s in enumerate(mixed)] == [
        s.loss_mask for s in mixed
    ]
    samples = trainer.rollout_func.records[-1].samples
    assert [s.sampling_spans for s in samples] == [s.sampling_spans for s in mixed]
    assert all(s.sampling_masked is None for s in samples)

    out = generate(enable_importance_sampling(trainer), len(mixed))
    samples = trainer.rollout_func.records[-1].samples
    for i, s in enumerate(mixed):
        n = len(s.response_ids)
        cold = s.sampling_spans[1] if len(s.sampling_spans or []) > 1 else None
        expected = list(s.loss_mask)
        if cold is not None:
            expected[cold["start"] : cold["end"]] = [0] * (cold["end"] - cold["start"])
            assert samples[i].sampling_masked == (
                f"{cold['end'] - cold['start']} of {sum(s.loss_mask)} loss tokens masked, sampled unlike the "
                f"trainer assumes: temperature 0.3, the trainer's 1 ({cold['end'] - cold['start']})"
            )
        else:
            assert samples[i].sampling_masked is None
        assert out["tool_mask"][i, :n].tolist() == expected
        assert samples[i].trainable  # the temperature-1 run still trains
