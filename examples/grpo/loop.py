"""The closed loop: submit → rollouts → claim groups → GRPO update → publish weights → the backend reloads.

    python -m examples.grpo --steps 4 --groups 2 --samples 6 --seed 0 --plot grpo_reward.png

``main`` runs everything in this process on the embedded defaults (SQLite, the local runtime, Prefect's
ephemeral mode, the gateway on the tiny local model) behind a real control API on a loopback port; the loop
itself only talks to that API through ``polar.client``, as a remote trainer would. Admission control is on
(``POLAR_MAX_ASYNC_LEVEL=0``): the tasks of step ``s`` start only after the weights of step ``s`` are published,
so every sample is on-policy and its captures must carry exactly that version, which the loop checks.

A run is reproducible: every sample's call is seeded (``--seed``, see ``toy``) and the update depends only on the
sampled ids and the rewards (``trainer``), so the same command prints the same rewards. The defaults (4 steps of
2 groups x 6 samples, Adam at 5e-2, 8 epochs) raise the mean reward at every step, visibly (``tests/ui/
test_ui_grpo_curves_browser.py`` checks it on ``/ui/live``); with 4 samples a group, one update's gain was within
the noise of a step's mean.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from examples.grpo.toy import toy_task
from examples.grpo.trainer import GRPOTrainer, StepStats
from polar.client import PolarClient

TRAINER = "grpo-example"


@dataclass(frozen=True)
class StepRecord:
    step: int
    version: str  # the weights the step's samples were drawn from
    stats: StepStats
    seconds: float


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
    log=print,
) -> list[StepRecord]:
    """``steps`` GRPO steps; raises if a sample was drawn under any version but the one live for its step.

    The next step's tasks are submitted before the update, carrying the ordinal of the version they are for as
    ``metadata.step``; admission control (max async level 0) holds them until the trainer publishes it. With a
    ``seed`` every sample's call is seeded (``toy_task``); the trainer sees the groups in task order, whatever
    order they finished in, so a run from the same start and seed repeats itself.
    """
    base = client.register_weights(version_name(0), state_dict=trainer.state_dict(), notes="the random start")[
        "ordinal"
    ]

    def submit(step: int) -> list[str]:
        return client.submit([toy_task(step=base + step, group=g, samples=samples, seed=seed) for g in range(groups)])

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
        client.register_weights(version_name(step + 1), state_dict=trainer.state_dict(), notes=f"after step {step}")
        record = StepRecord(step, version, stats, time.monotonic() - started)
        records.append(record)
        log(
            f"step {step:2d}  {version:14s} mean reward {stats.mean_reward:.3f}  "
            f"({stats.trajectories} samples, {stats.trained_tokens} trained tokens, loss {stats.loss:+.4f}, "
            f"max |logprob - captured| {stats.max_logprob_gap:.1e})  {record.seconds:5.1f} s"
        )
    return records


def save_plot(records: list[StepRecord], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot([r.step for r in records], [r.stats.mean_reward for r in records], marker="o")
    ax.set_xlabel("GRPO step (weight version the samples came from)")
    ax.set_ylabel("mean reward")
    ax.set_title("Toy task: share of letters in a-m, tiny model via Polar")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _environment(home: Path) -> None:
    os.environ["POLAR_HOME"] = str(home)
    os.environ["POLAR_TASK_DISPATCH"] = "inline"
    os.environ["POLAR_MAX_ASYNC_LEVEL"] = "0"
    os.environ.setdefault("POLAR_API_POLL_S", "0.1")
    os.environ.setdefault("POLAR_HEARTBEAT_S", "2")
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.grpo", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups", type=int, default=2, help="tasks per step")
    parser.add_argument("--samples", type=int, default=6, help="samples per task (the GRPO group size)")
    parser.add_argument("--lr", type=float, default=5e-2)
    parser.add_argument("--epochs", type=int, default=8, help="optimizer steps per GRPO step")
    parser.add_argument("--seed", type=int, default=0, help="seeds the trainer and every sample's call")
    parser.add_argument("--home", type=Path, help="POLAR_HOME (default: $POLAR_HOME, else a new temporary folder)")
    parser.add_argument("--plot", type=Path, default=Path("grpo_reward.png"))
    args = parser.parse_args(argv)
    home = args.home or Path(os.environ.get("POLAR_HOME") or tempfile.mkdtemp(prefix="polar-grpo-"))
    _environment(home)

    from flows.dispatch import run_inline
    from polar.api.server import build_app
    from polar.models.tiny import ensure_model_dir
    from polar.proxy.embedded import start_embedded
    from polar.rollout.context import close_contexts
    from polar.serving import ServerThread
    from polar.settings import get_settings

    settings = get_settings()
    trainer = GRPOTrainer(
        ensure_model_dir(settings.model, settings.cache_dir), lr=args.lr, epochs=args.epochs, seed=args.seed
    )
    print(
        f"POLAR_HOME={home}; model {settings.model}; {args.steps} steps x {args.groups} groups x {args.samples} samples"
    )
    try:
        with (
            ServerThread(build_app(settings, run_inline, start_embedded), lifespan="on") as api,
            PolarClient(api.url) as client,
        ):
            records = run_closed_loop(
                client, trainer, steps=args.steps, groups=args.groups, samples=args.samples, seed=args.seed
            )
    finally:
        close_contexts()
    curve = [round(r.stats.mean_reward, 3) for r in records]
    print(f"mean reward per step: {curve}")
    print(f"first -> last: {curve[0]:.3f} -> {curve[-1]:.3f}; best {max(curve):.3f}")
    save_plot(records, args.plot)
    print(f"plot: {args.plot.resolve()}")
    return 0
