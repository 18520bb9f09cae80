"""TRL's GRPOTrainer on Polar rollouts through the control API (``polar.integrations.trl``): versions per step,
loss-mask alignment, TRL's logprobs equal to the captured ones before each update, a failed group refused, a
mismatched tokenizer refused, and ``import polar`` free of TRL."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("trl")

from examples.grpo.toy import toy_task
from examples.trl_grpo.loop import INSTRUCTION, train
from polar.client import PolarClient
from polar.errors import GroupFailed, TokenizerMismatch
from polar.integrations.trl import PolarRolloutFunc
from tests.api.retry_task import check_kept_chain, retry_task

# TRL 1.16 sets transformers' renamed gradient-checkpointing options; and rollout_func is "experimental" in TRL.
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*gradient_checkpointing:FutureWarning"),
    pytest.mark.filterwarnings("ignore:You are using 'rollout_func':UserWarning"),
]


def test_importing_polar_and_its_integrations_does_not_import_trl():
    code = "import sys, polar, polar.integrations.groups, polar.integrations.trl; print('trl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_trl_closed_loop_versions_masks_and_logprobs(api, api_engine, tiny_model_dir, tmp_path):
    with PolarClient(api.url) as client:
        results = train(
            client, tiny_model_dir, steps=2, prompts=1, generations=3, lr=5e-2, output_dir=tmp_path, log=lambda _: None
        )
        versions = [r.record.version for r in results]
        assert [r.record.global_step for r in results] == [0, 1]
        assert versions[0].endswith("-step-0") and versions[1].endswith("-step-1")
        # The step's weights were published before its rollouts, and every sample was drawn under exactly them.
        assert client.weights()["current"] == versions[1] == api_engine.weight_version
        for result in results:
            samples = result.record.samples
            assert len(samples) == 3 and all(s.trainable for s in samples)
            assert {(s.weight_version_min, s.weight_version_max) for s in samples} == {(result.record.version,) * 2}
            for sample in samples:
                stored = client.trajectories(rollout_id=sample.rollout_id, builder="prefix_merge", tokens=True)
                assert len(stored) == 1
                # What TRL got is the stored trajectory: ids, mask and logprobs aligned token for token.
                assert sample.completion_ids == stored[0]["response_ids"]
                assert sample.loss_mask == stored[0]["loss_mask"]
                assert sample.logprobs == pytest.approx(stored[0]["response_logprobs"], abs=0)
                assert len(sample.completion_ids) == len(sample.loss_mask) == len(sample.logprobs)
                assert sample.prompt_ids == stored[0]["prompt_ids"]
            # TRL's own logprob of every trained token, before the update, is the one the backend sampled it with.
            assert result.trained_tokens == sum(map(sum, (s.loss_mask for s in samples))) > 0
            assert result.max_logprob_gap < 1e-5


def one_step(client: PolarClient, model_dir: Any, output_dir: Any, task: Any) -> list[Any]:
    """One GRPO step of one prompt with two generations, each made by ``task``; the step's results."""
    return train(
        client,
        model_dir,
        steps=1,
        prompts=1,
        generations=2,
        lr=5e-2,
        output_dir=output_dir,
        task=task,
        log=lambda _: None,
    )


def failing(prompt: Any) -> dict[str, Any]:
    task = toy_task(step=0, group=0, samples=1)
    task["harness"]["config"]["command"] = "{python} -c 'import sys; sys.exit(3)'"
    return {**task, "instruction": str(prompt)}


def test_a_group_whose_rollouts_all_fail_raises_instead_of_training(api, tiny_model_dir, tmp_path):
    with PolarClient(api.url) as client, pytest.raises(GroupFailed, match="none of its 2 samples can train"):
        one_step(client, tiny_model_dir, tmp_path, failing)


def half_failing(prompt: Any) -> dict[str, Any]:
    """Sample 0 replies "abc def" (reward 1), sample 1 "xyz", on which the harness then exits 1 (ERROR)."""
    task = toy_task(step=0, group=0, samples=1)
    check = "import sys; sys.exit('x' in open('reply.txt').read())"
    task["harness"]["config"]["command"] = f'{{python}} reply.py && {{python}} -c "{check}"'
    task["policies"] = [{"type": "scripted", "replies": [], "tool_free_reply": reply} for reply in ("abc def", "xyz")]
    return {**task, "instruction": str(prompt)}


def test_scripted_samples_never_reach_the_trainer_and_a_failed_one_is_masked(api, tiny_model_dir, tmp_path):
    """Scripted replies never train: a group whose samples are scripted (one of them failing) is refused whole,
    each sample with its reason, instead of TRL getting tokens no model sampled."""
    with PolarClient(api.url) as client, pytest.raises(GroupFailed) as caught:
        one_step(client, tiny_model_dir, tmp_path, half_failing)
    message = str(caught.value)
    # The scripted sample is left out of the trainer's view altogether; the failed one keeps its cause.
    assert (
        "sample 0 COMPLETED: no trajectory" in message
        and "sample 1 ERROR: no trajectory (the harness exited" in message
    )


def test_a_mismatched_tokenizer_refuses_to_start(api, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with PolarClient(api.url) as client:
        PolarRolloutFunc(client, tokenizer, {"harness": {"name": "agent"}})  # the served tokenizer: accepted
        tokenizer.add_tokens(["<not-in-polar>"])
        with pytest.raises(TokenizerMismatch, match="is not the one Polar serves"):
            PolarRolloutFunc(client, tokenizer, {"harness": {"name": "agent"}, "instruction": INSTRUCTION})


def test_trl_trains_the_chain_the_harness_kept_after_a_final_call_retry(api, tiny_model_dir, tmp_path):
    """Each rollout retried its last call after cutting its stream: TRL gets (and trains on) the kept chain, not the
    abandoned copy."""
    with PolarClient(api.url) as client:
        (result,) = one_step(client, tiny_model_dir, tmp_path, retry_task)
        for sample in result.record.samples:
            assert sample.trainable and sample.chains == 1
            check_kept_chain(client, sample.rollout_id, sample.completion_ids, sample.loss_mask)
        assert result.trained_tokens == sum(map(sum, (s.loss_mask for s in result.record.samples))) > 0
        assert result.max_logprob_gap < 1e-5  # TRL's logprobs of what it trained are the sampled ones


def test_the_closed_loop_runs_as_typed(tmp_path, tiny_model_dir):
    """``python -m examples.trl_grpo --steps 2`` (docs/trainers.md's command, shortened) on the embedded defaults in
    a clean environment: the entry point starts its own gateway, every step trains, and the summary lines print."""
    import os
    import re
    from pathlib import Path

    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / tiny_model_dir.name).symlink_to(tiny_model_dir)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("POLAR_", "PREFECT_"))}
    env["POLAR_CACHE"] = str(cache)
    argv = [sys.executable, "-m", "examples.trl_grpo", "--steps", "2", "--prompts", "1", "--generations", "3"]
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [*argv, "--home", str(tmp_path / "home")], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"^mean reward per step: \[[\d., ]+\]$", done.stdout, re.M), done.stdout
    gap = re.search(r"^max \|TRL logprob - captured\| over all steps: ([\d.e+-]+)$", done.stdout, re.M)
    assert gap and float(gap.group(1)) < 1e-5, done.stdout
