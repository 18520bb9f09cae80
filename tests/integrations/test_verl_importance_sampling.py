"""verl's rollout correction (truncated importance sampling) on ``PolarAgentLoop`` outputs reads the stored
behaviour logprobs.

``PolarAgentLoop`` hands verl each trajectory's ``response_logprobs``, which verl's ``as_dict`` turns into
``rollout_log_probs``; verl's ``compute_rollout_correction_and_add_to_batch`` (``algorithm.rollout_correction``:
``rollout_is`` token or sequence, ``rollout_is_threshold``) weighs each token by
``min(exp(old_log_probs - rollout_log_probs), threshold)``, zero on tokens outside ``response_mask``. The stored
logprobs here are the trainer's fp32 recompute minus known deltas (``tests.integrations.behaviour``), so the
weights must be ``min(exp(delta), cap)``. verl lives in an overlay (``scripts/verl_env.sh``); its code runs in a
child process (``verl_tis_probe``), and the test skips without the overlay (fails under ``CI=true``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integrations.behaviour import CAP, Stored, build, dump, sequence_weight, token_weight
from tests.verl import run_probe

SHAPES = [(9, 5, 3, 4), (6, 3, 0, 0), (11, 2, 4, 6)]  # (prompt, sampled, inserted, sampled)


@pytest.fixture(scope="module")
def stored(tiny_model_dir: Path) -> list[Stored]:
    return build(tiny_model_dir, SHAPES)


def probe(verl_site: Path, model_dir: Path, stored: list[Stored], mode: str, tmp_path: Path) -> dict[str, Any]:
    path = dump(stored, tmp_path / "stored.json")
    return run_probe(verl_site, "tests.integrations.verl_tis_probe", str(model_dir), str(path), mode)


def test_token_tis_weights_come_from_the_stored_behaviour_logprobs(verl_site, tiny_model_dir, stored, tmp_path):
    out = probe(verl_site, tiny_model_dir, stored, "token", tmp_path)
    for s, logprobs, mask, weights in zip(
        stored, out["rollout_log_probs"], out["response_mask"], out["rollout_is_weights"], strict=True
    ):
        n = len(s.response_ids)
        assert logprobs[:n] == pytest.approx(s.response_logprobs, abs=1e-6)  # float32 in verl's tensor
        assert mask[:n] == s.loss_mask and not any(mask[n:])
        expected = [token_weight(d) if m else 0.0 for d, m in zip(s.deltas, s.loss_mask, strict=True)]
        assert weights[:n] == pytest.approx(expected, rel=1e-5)
        assert weights[n:] == [0.0] * (len(weights) - n)  # padding: verl zeroes it
    assert max(max(w) for w in out["rollout_is_weights"]) == pytest.approx(CAP)  # the cap was reached and held


def test_sequence_tis_weight_is_the_capped_product_over_sampled_tokens(verl_site, tiny_model_dir, stored, tmp_path):
    out = probe(verl_site, tiny_model_dir, stored, "sequence", tmp_path)
    expected = [sequence_weight(d for d, m in zip(s.deltas, s.loss_mask, strict=True) if m) for s in stored]
    assert any(w == CAP for w in expected) and any(w < CAP for w in expected)
    for s, weights, w in zip(stored, out["rollout_is_weights"], expected, strict=True):
        n = len(s.response_ids)
        assert weights[:n] == pytest.approx([w if m else 0.0 for m in s.loss_mask], rel=1e-5)
