"""TRL's ``GRPOTrainer`` in a closed loop with Polar: publish weights -> rollouts -> TRL's GRPO loss -> publish.

    python -m examples.trl_grpo --steps 8 --prompts 2 --generations 4

``main`` runs the whole stack in this process on the embedded defaults (SQLite, the local runtime, Prefect's
ephemeral mode, the gateway on the tiny local model) behind a real control API on a loopback port; the trainer
talks to it only through ``polar.client`` (``PolarRolloutFunc``). The task is the toy one of ``examples.grpo``
(reply with letters from a-m; the reward is their share), run by a real program calling the session's Chat
Completions API as the harness.

``CheckedGRPOTrainer`` adds one check to TRL: at every generation, before the update that uses it, TRL's own
logprob of each trained token (its ``_get_per_token_logps_and_entropies`` over its padded batch) against the
logprob the backend captured when it sampled that token.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from examples.grpo.loop import _environment
from examples.grpo.toy import toy_task
from polar.client import PolarClient
from polar.integrations.trl import PolarRolloutFunc, RolloutRecord, polar_reward

INSTRUCTION = "Write a few words using only the letters a to m."


def toy(prompt: Any) -> dict[str, Any]:
    """The Polar task for a dataset prompt: the toy task with the prompt as its instruction."""
    return {**toy_task(step=0, group=0, samples=1), "instruction": str(prompt)}


@dataclass(frozen=True)
class StepResult:
    record: RolloutRecord
    max_logprob_gap: float  # TRL's logprob vs the captured one, over trained tokens, before the update
    trained_tokens: int
    seconds: float


def checked_trainer_class() -> type:
    """``GRPOTrainer`` with the logprob check (built lazily so importing this module does not import TRL)."""
    from trl import GRPOTrainer

    class CheckedGRPOTrainer(GRPOTrainer):
        logprob_gaps: list[tuple[float, int]]

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            out = super()._generate_and_score_completions(inputs)
            mask = out["completion_mask"] * out.get("tool_mask", torch.ones_like(out["completion_mask"]))
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
            with torch.no_grad():
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, ids, attention, out["completion_ids"].size(1)
                )
            gap = float(((logps - out["sampling_per_token_logps"]).abs() * mask).max())
            self.logprob_gaps = [*getattr(self, "logprob_gaps", []), (gap, int(mask.sum()))]
            return out

    return CheckedGRPOTrainer


def train(
    client: PolarClient,
    model_dir: Path,
    *,
    steps: int,
    prompts: int,
    generations: int,
    lr: float,
    iterations: int = 1,
    output_dir: Path,
    task: Callable[[Any], dict[str, Any]] = toy,
    log: Callable[[str], None] = print,
) -> list[StepResult]:
    """``steps`` GRPO steps of TRL on Polar rollouts; each step is one generation of ``prompts`` groups of
    ``task(prompt)``, trained on for ``iterations`` optimizer steps (TRL's ``num_iterations``: from the second one
    on, its clipped ratio is against the logprobs TRL computed before the first)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from datasets import Dataset  # type: ignore[attr-defined]  # mypy sees the repo's datasets/ folder

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rollout = PolarRolloutFunc(client, tokenizer, task, max_staleness=0)
    config = GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        max_steps=steps * iterations,
        num_iterations=iterations,
        per_device_train_batch_size=prompts * generations,
        num_generations=generations,
        learning_rate=lr,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    dataset = Dataset.from_dict({"prompt": [INSTRUCTION] * (prompts * max(steps, 1))})
    trainer = checked_trainer_class()(
        model=model,
        reward_funcs=polar_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout,
    )
    results: list[StepResult] = []
    started = time.monotonic()

    def on_record() -> None:
        nonlocal started
        record = rollout.records[len(results)]
        gap, tokens = trainer.logprob_gaps[len(results)]
        results.append(StepResult(record, gap, tokens, time.monotonic() - started))
        started = time.monotonic()
        log(
            f"step {record.global_step:2d}  {record.version:22s} mean reward {record.mean_reward:.3f}  "
            f"({len(record.samples)} samples, {tokens} trained tokens, "
            f"max |TRL logprob - captured| {gap:.1e})  {results[-1].seconds:5.1f} s"
        )

    from transformers import TrainerCallback

    class Report(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            while len(results) < len(rollout.records) and len(results) < len(trainer.logprob_gaps):
                on_record()

    trainer.add_callback(Report())
    trainer.train()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.trl_grpo", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=2, help="groups (Polar tasks) per step")
    parser.add_argument("--generations", type=int, default=4, help="TRL num_generations (samples per task)")
    parser.add_argument("--lr", type=float, default=5e-2)
    parser.add_argument("--iterations", type=int, default=4, help="TRL num_iterations (updates per generation)")
    parser.add_argument("--home", type=Path, help="POLAR_HOME (default: a new temporary folder)")
    args = parser.parse_args(argv)
    home = args.home or Path(tempfile.mkdtemp(prefix="polar-trl-"))
    _environment(home)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.16

    from flows.dispatch import run_inline
    from flows.prefect_server import temporary_server
    from polar.api.server import build_app
    from polar.models.tiny import ensure_model_dir
    from polar.proxy.embedded import start_embedded
    from polar.rollout.context import close_contexts
    from polar.serving.threaded import ServerThread
    from polar.settings import get_settings

    settings = get_settings()
    model_dir = ensure_model_dir(settings.model, settings.cache_dir)
    print(f"POLAR_HOME={home}; model {settings.model}; {args.steps} steps x {args.prompts} x {args.generations}")
    try:
        with (
            temporary_server(settings),  # started once, locked, before any flow, and stopped at the end
            ServerThread(build_app(settings, run_inline, start_embedded), lifespan="on") as api,
            PolarClient(api.url) as client,
        ):
            results = train(
                client,
                model_dir,
                steps=args.steps,
                prompts=args.prompts,
                generations=args.generations,
                lr=args.lr,
                iterations=args.iterations,
                output_dir=home / "trl",
            )
    finally:
        close_contexts()
    curve = [round(r.record.mean_reward, 3) for r in results]
    print(f"mean reward per step: {curve}")
    print(f"first -> last: {curve[0]:.3f} -> {curve[-1]:.3f}; best {max(curve):.3f}")
    print(f"max |TRL logprob - captured| over all steps: {max(r.max_logprob_gap for r in results):.1e}")
    return 0
