"""The closed loop through the control API: claims, GRPO update, published weights reloaded by the backend,
and every sample drawn under exactly the version live for its step (admission control at async level 0)."""

from __future__ import annotations

import torch

from examples.grpo.loop import run_closed_loop, version_name
from examples.grpo.trainer import GRPOTrainer, advantages
from polar.client import PolarClient


def test_group_advantages_are_normalised_and_zero_without_spread():
    assert advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    a = advantages([0.0, 1.0])
    assert abs(a[0] + 1) < 1e-5 and abs(a[1] - 1) < 1e-5


def test_closed_loop_publishes_versions_the_backend_serves(api, api_engine, tiny_model_dir):
    trainer = GRPOTrainer(tiny_model_dir)
    with PolarClient(api.url) as client:
        records = run_closed_loop(client, trainer, steps=2, groups=1, samples=3, seed=0, log=lambda *_: None)
        assert [r.version for r in records] == [version_name(0), version_name(1)]
        assert client.weights()["current"] == version_name(2)
    # The captured logprobs are the trainer's own under the weights it published: token-faithful end to end.
    assert all(r.stats.max_logprob_gap < 1e-4 and r.stats.trajectories == 3 for r in records)
    assert api_engine.weight_version == version_name(2)
    live = api_engine.model.state_dict()
    assert all(torch.equal(live[k], v) for k, v in trainer.state_dict().items())


def test_the_real_model_trains_through_the_command_as_typed(tmp_path, smollm2_dir):
    """``python -m examples.grpo --model smollm2-135m-instruct`` on the embedded defaults, shortened: every step
    prints its line, the samples' captured logprobs are the trainer's own at the sampling temperature, and the
    weights go out as one checkpoint folder at a time (the converted folder comes from the fetch cache)."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / smollm2_dir.name).symlink_to(smollm2_dir)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("POLAR_", "PREFECT_"))}
    env["POLAR_CACHE"] = str(cache)
    home = tmp_path / "home"
    argv = [sys.executable, "-m", "examples.grpo", "--model", "smollm2-135m-instruct", "--steps", "2"]
    argv += ["--groups", "1", "--samples", "3", "--seed", "0", "--home", str(home), "--plot", str(tmp_path / "r.png")]
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = re.findall(
        r"^step (\d) mean_reward=[\d.]+ solve_rate=[\d.]+ trainable_tokens=\d+ seconds=[\d.]+ .*"
        r"max \|logprob - captured\| ([\d.e+-]+)\)$",
        done.stdout,
        re.M,
    )
    assert [s for s, _ in steps] == ["0", "1"], done.stdout
    assert all(float(gap) < 1e-3 for _, gap in steps), done.stdout
    assert re.search(r"^total: 2 steps, \d+ trainable tokens, \d+ s$", done.stdout, re.M), done.stdout
    assert [p.name for p in (home / "checkpoints").iterdir()] == ["grpo-step-2"]
