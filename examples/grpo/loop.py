"""The closed loop: submit → rollouts → claim groups → GRPO update → publish weights → the backend reloads.

    python -m examples.grpo --steps 4 --groups 2 --samples 6 --seed 0 --plot grpo_reward.png
    python -m examples.grpo --model smollm2-135m-instruct --steps 12 --seed 0

``main`` runs everything in this process on the embedded defaults (SQLite, the local runtime, Prefect's
ephemeral mode, the gateway on the local model ``--model`` names) behind a real control API on a loopback port;
the loop itself only talks to that API through ``polar.client``, as a remote trainer would. Admission control is
on (``POLAR_MAX_ASYNC_LEVEL=0``): the tasks of step ``s`` start only after the weights of step ``s`` are
published, so every sample is on-policy and its captures must carry exactly that version, which the loop checks.

Each model has a recipe (``RECIPES``): the tiny random model learns the toy task (``toy``: letters from a to m,
4 steps of 2 groups x 6 samples, Adam at 5e-2, 8 epochs, which raise the mean reward at every step, as
``tests/ui/test_ui_grpo_curves_browser.py`` checks on ``/ui/live``); the real SmolLM2-135M-Instruct learns
one-word answers to simple questions (``flows.demo_tasks.question_task``: 4 groups x 6 samples at temperature
0.7, Adam at 3e-5, one epoch). Flags override a recipe's numbers.

A run is reproducible: every sample's call is seeded (``--seed``) and the update depends only on the sampled ids
and the rewards (``trainer``), so the same command prints the same rewards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.grpo.toy import toy_task
from examples.grpo.trainer import GRPOTrainer, StepStats
from flows.demo_tasks import question_task
from polar.client import PolarClient

TRAINER = "grpo-example"


@dataclass(frozen=True)
class StepRecord:
    step: int
    version: str  # the weights the step's samples were drawn from
    stats: StepStats
    seconds: float


@dataclass(frozen=True)
class Recipe:
    """What a model is trained on and how: the task of a group, and the loop's and trainer's defaults."""

    task: Callable[..., dict[str, Any]]  # (step=, group=, samples=, seed=) -> a task, as toy_task
    groups: int
    samples: int
    lr: float
    epochs: int
    temperature: float = 1.0


TOY = Recipe(toy_task, groups=2, samples=6, lr=5e-2, epochs=8)
QUESTIONS = Recipe(question_task, groups=4, samples=6, lr=3e-5, epochs=1, temperature=0.7)
RECIPES: dict[str, Recipe] = {"smollm2-135m-instruct": QUESTIONS}  # any other model: the toy task


def version_name(step: int) -> str:
    return f"grpo-step-{step}"


def run_closed_loop(
    client: PolarClient,
    trainer: GRPOTrainer,
    *,
    steps: int,
    groups: int,
    samples: int,
    seed: int | None = None,
    recipe: Recipe = TOY,
    checkpoints: Path | None = None,
    log: Callable[[str], object] = print,
) -> list[StepRecord]:
    """``steps`` GRPO steps; raises if a sample was drawn under any version but the one live for its step.

    The next step's tasks are submitted before the update, carrying the ordinal of the version they are for as
    ``metadata.step``; admission control (max async level 0) holds them until the trainer publishes it. With a
    ``seed`` every sample's call is seeded (``toy_task``); the trainer sees the groups in task order, whatever
    order they finished in, so a run from the same start and seed repeats itself. ``recipe.task`` makes the groups.

    Weights are published as uploaded tensors, or with ``checkpoints`` as a safetensors folder there per version
    (what a real trainer does: the backends read the path; uploading 0.5 GB through two HTTP hops in one process
    costs minutes), each removed once the next version is live.
    """

    def publish(version: str, notes: str) -> dict[str, Any]:
        if checkpoints is None:
            return client.register_weights(version, state_dict=trainer.state_dict(), notes=notes)
        folder = checkpoints / version
        trainer.save(folder)
        record = client.register_weights(version, checkpoint_path=str(folder), notes=notes)
        for older in checkpoints.iterdir():
            if older != folder:
                shutil.rmtree(older)
        return record

    base = publish(version_name(0), "the start")["ordinal"]

    def submit(step: int) -> list[str]:
        return client.submit(
            [recipe.task(step=base + step, group=g, samples=samples, seed=seed) for g in range(groups)]
        )

    records, pending = [], submit(0)
    for step in range(steps):
        started = time.monotonic()
        version = version_name(step)
        client.wait(pending, timeout_s=1800)
        batch = client.claim(TRAINER, max_groups=groups, max_staleness=0)
        claimed = sorted(batch["groups"], key=lambda g: g["metadata"]["group"])
        if sorted(g["task_id"] for g in claimed) != sorted(pending):
            raise RuntimeError(f"step {step}: claimed {len(claimed)} groups, expected the {groups} just run")
        seen = {
            v for g in claimed for t in g["trajectories"] for v in (t["weight_version_min"], t["weight_version_max"])
        }
        if seen != {version}:
            raise RuntimeError(
                f"step {step}: samples carry weight versions {sorted(map(str, seen))}, expected {version}"
            )
        pending = submit(step + 1) if step + 1 < steps else []
        held = [client.task(t)["held"] for t in pending]
        if not all(held):
            raise RuntimeError(f"step {step}: admission control let tasks of the next step start before its weights")
        stats = trainer.step(claimed)
        client.ack(batch["claim_id"], TRAINER)
        publish(version_name(step + 1), f"after step {step}")
        record = StepRecord(step, version, stats, time.monotonic() - started)
        records.append(record)
        log(
            f"step {step} mean_reward={stats.mean_reward:.3f} solve_rate={stats.solve_rate:.3f} "
            f"trainable_tokens={stats.trained_tokens} seconds={record.seconds:.1f}  "
            f"(version {version}, {stats.trajectories} samples, loss {stats.loss:+.4f}, "
            f"max |logprob - captured| {stats.max_logprob_gap:.1e})"
        )
    return records


def save_plot(records: list[StepRecord], path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot([r.step for r in records], [r.stats.mean_reward for r in records], marker="o")
    ax.set_xlabel("GRPO step (weight version the samples came from)")
    ax.set_ylabel("mean reward")
    ax.set_title(f"GRPO through Polar: {model}")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _environment(home: Path) -> None:
    """Settings for a run in ``home``; models stay in the cache they were fetched into (``polar model fetch``)."""
    from polar.settings import get_settings

    os.environ.setdefault("POLAR_CACHE", str(get_settings().cache_dir))
    os.environ["POLAR_HOME"] = str(home)
    os.environ["POLAR_TASK_DISPATCH"] = "inline"
    os.environ["POLAR_MAX_ASYNC_LEVEL"] = "0"
    os.environ.setdefault("POLAR_API_POLL_S", "0.1")
    os.environ.setdefault("POLAR_HEARTBEAT_S", "2")
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    get_settings.cache_clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.grpo", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="the local model: a toy name or a pretrained one (default: $POLAR_MODEL)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups", type=int, help="tasks per step (default: the model's recipe)")
    parser.add_argument("--samples", type=int, help="samples per task, the GRPO group size (default: the recipe's)")
    parser.add_argument("--lr", type=float, help="Adam's learning rate (default: the recipe's)")
    parser.add_argument("--epochs", type=int, help="optimizer steps per GRPO step (default: the recipe's)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the trainer and every sample's call")
    parser.add_argument("--home", type=Path, help="POLAR_HOME (default: $POLAR_HOME, else a new temporary folder)")
    parser.add_argument("--plot", type=Path, default=Path("grpo_reward.png"))
    args = parser.parse_args(argv)
    home = args.home or Path(os.environ.get("POLAR_HOME") or tempfile.mkdtemp(prefix="polar-grpo-"))
    if args.model:
        os.environ["POLAR_MODEL"] = args.model
    _environment(home)

    from flows.dispatch import run_inline
    from flows.prefect_server import temporary_server
    from polar.api.server import build_app
    from polar.models.tiny import ensure_model_dir
    from polar.proxy.embedded import start_embedded
    from polar.rollout.context import close_contexts
    from polar.serving.threaded import ServerThread
    from polar.settings import get_settings

    settings = get_settings()
    recipe = RECIPES.get(settings.model, TOY)
    groups, samples = args.groups or recipe.groups, args.samples or recipe.samples
    trainer = GRPOTrainer(
        ensure_model_dir(settings.model, settings.cache_dir),
        lr=args.lr or recipe.lr,
        epochs=args.epochs or recipe.epochs,
        seed=args.seed,
        temperature=recipe.temperature,
    )
    print(f"POLAR_HOME={home}; model {settings.model}; {args.steps} steps x {groups} groups x {samples} samples")
    started = time.monotonic()
    try:
        with (
            temporary_server(settings),  # started once, locked, before any flow, and stopped at the end
            ServerThread(build_app(settings, run_inline, start_embedded), lifespan="on") as api,
            PolarClient(api.url) as client,
        ):
            records = run_closed_loop(
                client,
                trainer,
                steps=args.steps,
                groups=groups,
                samples=samples,
                seed=args.seed,
                recipe=recipe,
                checkpoints=home / "checkpoints",
            )
    finally:
        close_contexts()
    curve = [round(r.stats.mean_reward, 3) for r in records]
    print(f"mean reward per step: {curve}")
    print(f"first -> last: {curve[0]:.3f} -> {curve[-1]:.3f}; best {max(curve):.3f}")
    if len(curve) >= 4:
        first, last = sum(curve[:2]) / 2, sum(curve[-2:]) / 2
        print(f"first two steps {first:.3f} -> last two {last:.3f} ({last - first:+.3f})")
    tokens = sum(r.stats.trained_tokens for r in records)
    print(f"total: {len(records)} steps, {tokens} trainable tokens, {time.monotonic() - started:.0f} s")
    save_plot(records, args.plot, settings.model)
    print(f"plot: {args.plot.resolve()}")
    return 0
