"""``polar verify``: re-feed stored captures to a backend and report, per rollout, whether it reproduces them.

For every OK, sampled (not scripted) capture with output, the capture's full prompt (its parent's sequence cut to
``prefix_len`` plus its own delta) goes back to the backend:

- **greedy captures** (temperature below SGLang's 1e-6): a greedy replay of ``n_output`` tokens under the stored
  sampling parameters. Every replayed id must equal the stored one (the first difference is a token mismatch)
  and the logprobs are compared position by position up to it. This works on every backend (SGLang's
  ``/generate``, ``polar serve-model``, the local engine, vLLM).
- **sampled captures**: one single-token request per sampled position asking the stored id's logprob
  (SGLang's ``token_ids_logprob``) at the stored temperature; a backend without it (vLLM) reports the capture
  as not checked, never as passed.

A capture that stored routed experts (a MoE capture) is also re-fed asking for them (its sequence but the last
sampled id, from ``experts_start``); the replayed rows must equal the stored ones exactly ("routing reproduced").

A rollout fails when its largest logprob gap exceeds the tolerance or any token mismatches (or routing differs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from db import Capture, CaptureStatus
from polar.capture_extras import stored_extras
from polar.errors import PolarError
from polar.inference import Backend, ExtrasRequest, GenerateRequest, SamplingParams


@dataclass
class RolloutCheck:
    """What re-feeding one rollout's captures showed."""

    rollout_id: str
    captures: int = 0
    tokens: int = 0
    max_gap: float = 0.0
    mismatches: list[str] = field(default_factory=list)  # "capture 12 position 3: stored 17, replayed 40"
    unchecked: list[str] = field(default_factory=list)  # captures the backend could not rescore, with why
    routing: bool | None = None  # None: no MoE capture; else whether every stored routing was reproduced

    def failed(self, tolerance: float) -> bool:
        return self.max_gap > tolerance or bool(self.mismatches) or self.routing is False

    def line(self, tolerance: float) -> str:
        verdict = "FAIL" if self.failed(tolerance) else "ok"
        routing = "" if self.routing is None else f", routing {'reproduced' if self.routing else 'DIFFERS'}"
        unchecked = f", {len(self.unchecked)} capture(s) not checked" if self.unchecked else ""
        return (
            f"{verdict} {self.rollout_id}: {self.captures} captures, {self.tokens} tokens, max logprob gap "
            f"{self.max_gap:.3g}, {len(self.mismatches)} token mismatch(es){routing}{unchecked}"
        )


def select_rollouts(db: Session, *, rollout_id: str | None, task_id: str | None, limit: int | None) -> list[str]:
    """Rollouts with captures: one, a task's, or the most recent ``limit`` (newest capture first)."""
    query = sa.select(Capture.rollout_id, sa.func.max(Capture.id).label("last")).group_by(Capture.rollout_id)
    if rollout_id is not None:
        query = query.where(Capture.rollout_id == rollout_id)
    if task_id is not None:
        from db import Rollout

        query = query.where(Capture.rollout_id.in_(sa.select(Rollout.id).where(Rollout.task_id == task_id)))
    query = query.order_by(sa.desc("last"))
    if limit is not None:
        query = query.limit(limit)
    return [row.rollout_id for row in db.execute(query)]


def load_captures(db: Session, rollout_id: str) -> list[Capture]:
    return list(db.scalars(sa.select(Capture).where(Capture.rollout_id == rollout_id).order_by(Capture.seq)))


def _prompts(captures: Sequence[Capture]) -> dict[int, list[int]]:
    """Each capture's full prompt ids: its parent's prompt + output cut to ``prefix_len``, then its delta."""
    sequences: dict[int, list[int]] = {}
    prompts: dict[int, list[int]] = {}
    for capture in captures:  # seq order: a parent comes before its children
        base = sequences.get(capture.parent_id, []) if capture.parent_id is not None else []
        prompts[capture.id] = base[: capture.prefix_len] + list(capture.prompt_delta_ids)
        sequences[capture.id] = prompts[capture.id] + list(capture.output_ids)
    return prompts


async def verify_rollout(backend: Backend, rollout_id: str, captures: Sequence[Capture]) -> RolloutCheck:
    """Re-feed one rollout's captures to ``backend`` (the module docstring says how)."""
    check = RolloutCheck(rollout_id)
    prompts = _prompts(captures)
    for capture in captures:
        if capture.status is not CaptureStatus.OK or capture.scripted or not capture.output_ids:
            continue
        check.captures += 1
        check.tokens += len(capture.output_ids)
        try:
            sampling = SamplingParams.parse(dict(capture.sampling_params or {}))
            if sampling.greedy:
                await _greedy(backend, capture, prompts[capture.id], sampling, check)
            else:
                await _teacher_forced(backend, capture, prompts[capture.id], sampling, check)
            await _routing(backend, capture, prompts[capture.id], check)
        except PolarError as exc:
            check.unchecked.append(f"capture {capture.id}: {exc.message}")
    return check


async def _greedy(
    backend: Backend, capture: Capture, prompt: list[int], sampling: SamplingParams, check: RolloutCheck
) -> None:
    stored_ids, stored_lp = list(capture.output_ids), list(capture.output_logprobs)
    replay = sampling.model_copy(update={"max_new_tokens": len(stored_ids), "min_new_tokens": 0})
    result = await backend.generate(GenerateRequest(tuple(prompt), replay))
    got = list(result.output_ids)
    same = 0
    while same < min(len(got), len(stored_ids)) and got[same] == stored_ids[same]:
        same += 1
    if same < len(stored_ids) or len(got) != len(stored_ids):
        replayed = got[same] if same < len(got) else "nothing (the replay stopped)"
        stored = stored_ids[same] if same < len(stored_ids) else "nothing"
        check.mismatches.append(f"capture {capture.id} position {same}: stored {stored}, replayed {replayed}")
    for a, b in zip(stored_lp[:same], result.output_logprobs[:same], strict=True):
        check.max_gap = max(check.max_gap, abs(a - b))


async def _routing(backend: Backend, capture: Capture, prompt: list[int], check: RolloutCheck) -> None:
    """Re-feed the capture's whole sequence but its last sampled id (never fed to the model) asking the routed
    experts of the stored rows' positions: one generated token, whose routing is not compared."""
    stored = stored_extras(capture).routed_experts
    if stored is None:
        return
    start = int(capture.experts_start or 0)
    context = prompt + list(capture.output_ids[:-1])
    extras = ExtrasRequest(routed_experts=True, routed_experts_start=start)
    result = await backend.generate(
        GenerateRequest(tuple(context), SamplingParams(max_new_tokens=1, temperature=0.0), extras=extras)
    )
    replayed = result.extras.routed_experts if result.extras is not None else None
    ok = replayed is not None and np.array_equal(replayed[: len(stored)], stored)
    check.routing = ok if check.routing is None else check.routing and ok
    if not ok:
        check.mismatches.append(f"capture {capture.id}: replayed routing differs from the stored routed experts")


async def _teacher_forced(
    backend: Backend, capture: Capture, prompt: list[int], sampling: SamplingParams, check: RolloutCheck
) -> None:
    one = SamplingParams(temperature=sampling.temperature, max_new_tokens=1, ignore_eos=True)
    context = list(prompt)
    for token, stored in zip(capture.output_ids, capture.output_logprobs, strict=True):
        request = GenerateRequest(tuple(context), one, extras=ExtrasRequest(token_ids=(token,)))
        result = await backend.generate(request)
        values = result.extras.token_ids_logprobs if result.extras is not None else None
        if values is None:
            check.unchecked.append(f"capture {capture.id}: the {backend.name} backend returned no token_ids_logprob")
            return
        check.max_gap = max(check.max_gap, abs(float(values[0][0]) - stored))
        context.append(token)


def summary(checks: Sequence[RolloutCheck], tolerance: float) -> dict[str, Any]:
    failed = [c.rollout_id for c in checks if c.failed(tolerance)]
    gaps = [c.max_gap for c in checks if c.tokens]
    return {
        "rollouts": len(checks),
        "failed": len(failed),
        "max_gap": max(gaps, default=0.0),
        "tokens": sum(c.tokens for c in checks),
        "tolerance": tolerance,
    }
