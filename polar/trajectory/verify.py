"""``polar verify``: re-feed stored captures and the stored trajectories a trainer reads to a backend, and report,
per rollout, whether it reproduces them.

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

Each stored ``trajectories`` row is checked against its captures (``polar.trajectory.verify_rows``: ids, mask and
logprobs by position) and re-scored: each capture's output as the row holds it, in the row's own context, is
compared with what the engine made of that context. A row segment equal to its capture shares the capture's
result; one that differs is compared with the capture's greedy replay, or re-scored teacher-forced. Segments after
a conditioning-inexact merge (their context in the row is not the prompt they were sampled on) are re-scored on
the capture's own prompt only.

Every token mismatch and every logprob gap over the tolerance is named by capture and position (and trajectory,
for a row). A rollout fails on any of them, on any place where a row is not what its captures give, or when
routing differs; a rollout where nothing was compared (no sampled capture the backend could re-score, no stored
row) is "not checked", never "ok".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from db import Capture, CaptureStatus, Rollout, Task
from polar.capture_extras import stored_extras
from polar.errors import NotFound, PolarError
from polar.inference import Backend, ExtrasRequest, GenerateRequest, SamplingParams
from polar.trajectory.liveness import SAME_LOGPROB_TOLERANCE
from polar.trajectory.verify_rows import RowCheck


@dataclass(frozen=True)
class Replay:
    """What the engine made of a capture's context: a greedy replay (the ids it generated) or, for a sampled
    capture, the given ids teacher-forced; with the engine's logprob of each id."""

    greedy: bool
    ids: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass
class RolloutCheck:
    """What re-feeding one rollout's captures and stored trajectories showed (gaps named at ``tolerance``)."""

    rollout_id: str
    tolerance: float = SAME_LOGPROB_TOLERANCE
    captures: int = 0  # sampled captures re-fed
    tokens: int = 0
    rescored: int = 0  # captures the engine did re-score
    max_gap: float = 0.0
    mismatches: list[str] = field(default_factory=list)  # "capture 12 position 3: stored 17, replayed 40"
    gaps: list[str] = field(default_factory=list)  # every logprob gap over the tolerance, by capture and position
    trajectories: int = 0  # stored trajectory rows checked
    records: list[str] = field(default_factory=list)  # where a stored row is not what its captures give
    unchecked: list[str] = field(default_factory=list)  # captures the backend could not rescore, with why
    routing: bool | None = None  # None: no MoE capture; else whether every stored routing was reproduced

    @property
    def checked(self) -> bool:
        """Whether anything was compared: a capture the engine re-scored, or a stored row."""
        return self.rescored > 0 or self.trajectories > 0

    def failed(self, tolerance: float | None = None) -> bool:
        over = self.max_gap > (self.tolerance if tolerance is None else tolerance)
        return over or bool(self.mismatches or self.gaps or self.records) or self.routing is False

    def problems(self) -> list[str]:
        """Every finding, one line each: token mismatches, gaps, row disagreements, then what was not checked."""
        return self.mismatches + self.gaps + self.records + self.unchecked

    def line(self, tolerance: float | None = None) -> str:
        unchecked = f", {len(self.unchecked)} capture(s) not checked" if self.unchecked else ""
        if not self.checked and not self.failed(tolerance):
            return (
                f"not checked {self.rollout_id}: nothing compared ({self.captures} sampled captures, none "
                f"re-scored; no stored trajectory){unchecked}"
            )
        verdict = "FAIL" if self.failed(tolerance) else "ok"
        routing = "" if self.routing is None else f", routing {'reproduced' if self.routing else 'DIFFERS'}"
        return (
            f"{verdict} {self.rollout_id}: {self.captures} captures, {self.tokens} tokens, max logprob gap "
            f"{self.max_gap:.3g}, {len(self.mismatches)} token mismatch(es), {len(self.gaps)} gap(s) over "
            f"{self.tolerance:g}, {self.trajectories} trajectories ({len(self.records)} disagreement(s) with "
            f"their captures){routing}{unchecked}"
        )


def select_rollouts(db: Session, *, rollout_id: str | None, task_id: str | None, limit: int | None) -> list[str]:
    """One rollout, a task's (by creation; ``limit`` of them when given), or the most recent ``limit`` rollouts
    with captures (newest capture first). A named rollout or task is selected even without captures (it prints
    "not checked"); an unknown one raises ``NotFound``."""
    if rollout_id is None and task_id is None:
        query = sa.select(Capture.rollout_id, sa.func.max(Capture.id).label("last")).group_by(Capture.rollout_id)
        return [row.rollout_id for row in db.execute(query.order_by(sa.desc("last")).limit(limit))]
    named = sa.select(Rollout.id).order_by(Rollout.created_at, Rollout.id)
    if rollout_id is not None:
        named = named.where(Rollout.id == rollout_id)
    if task_id is not None:
        named = named.where(Rollout.task_id == task_id)
    selected = list(db.scalars(named.limit(limit)))
    if rollout_id is not None and not selected:
        raise NotFound(f"no rollout {rollout_id!r}" + (f" in task {task_id!r}" if task_id else ""), field="rollout")
    if task_id is not None and db.get(Task, task_id) is None:
        raise NotFound(f"no task {task_id!r}", field="task")
    return selected


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


async def verify_rollout(
    backend: Backend,
    rollout_id: str,
    captures: Sequence[Capture],
    rows: Sequence[RowCheck] = (),
    *,
    tolerance: float = SAME_LOGPROB_TOLERANCE,
) -> RolloutCheck:
    """Re-feed one rollout's captures to ``backend``, then re-score its stored rows (``rows``: already checked
    against the captures, ``polar.trajectory.verify_rows``); the module docstring says how."""
    check = RolloutCheck(rollout_id, tolerance)
    prompts = _prompts(captures)
    replays: dict[int, Replay] = {}
    for capture in captures:
        if capture.status is not CaptureStatus.OK or capture.scripted or not capture.output_ids:
            continue
        check.captures += 1
        check.tokens += len(capture.output_ids)
        try:
            sampling = SamplingParams.parse(dict(capture.sampling_params or {}))
            replay = await _replay(backend, prompts[capture.id], tuple(capture.output_ids), sampling)
            if replay is None:
                check.unchecked.append(
                    f"capture {capture.id}: the {backend.name} backend returned no token_ids_logprob"
                )
            else:
                replays[capture.id] = replay
                check.rescored += 1
                where = f"capture {capture.id} position"
                _compare(check, tuple(capture.output_ids), tuple(capture.output_logprobs), replay, where)
            await _routing(backend, capture, prompts[capture.id], check)
        except PolarError as exc:
            check.unchecked.append(f"capture {capture.id}: {exc.message}")
    by_id = {capture.id: capture for capture in captures}
    for row in rows:
        check.trajectories += 1
        check.records.extend(row.problems)
        try:
            await _rescore_row(backend, row, by_id, prompts, replays, check)
        except PolarError as exc:
            check.unchecked.append(f"{row.row.name}: {exc.message}")
    return check


async def _replay(
    backend: Backend, prompt: Sequence[int], ids: tuple[int, ...], sampling: SamplingParams
) -> Replay | None:
    """A greedy replay of ``len(ids)`` tokens under ``sampling``, or ``ids`` teacher-forced at its temperature
    (``None``: the backend returns no ``token_ids_logprob``)."""
    if sampling.greedy:
        replay = sampling.model_copy(update={"max_new_tokens": len(ids), "min_new_tokens": 0})
        result = await backend.generate(GenerateRequest(tuple(prompt), replay))
        return Replay(True, tuple(result.output_ids), tuple(result.output_logprobs))
    one = SamplingParams(temperature=sampling.temperature, max_new_tokens=1, ignore_eos=True)
    context = list(prompt)
    logprobs: list[float] = []
    for token in ids:
        request = GenerateRequest(tuple(context), one, extras=ExtrasRequest(token_ids=(token,)))
        result = await backend.generate(request)
        values = result.extras.token_ids_logprobs if result.extras is not None else None
        if values is None:
            return None
        logprobs.append(float(values[0][0]))
        context.append(token)
    return Replay(False, ids, tuple(logprobs))


def _compare(
    check: RolloutCheck, ids: tuple[int, ...], logprobs: tuple[float, ...], replay: Replay, where: str
) -> None:
    """Stored ``ids``/``logprobs`` against ``replay``: the first id the replay does not reproduce is a token
    mismatch, and every logprob gap over the tolerance up to it is named (``where`` names the position)."""
    same = 0
    while same < min(len(replay.ids), len(ids)) and replay.ids[same] == ids[same]:
        same += 1
    if same < len(ids) or len(replay.ids) != len(ids):
        replayed = replay.ids[same] if same < len(replay.ids) else "nothing (the replay stopped)"
        stored = ids[same] if same < len(ids) else "nothing"
        check.mismatches.append(f"{where} {same}: stored {stored}, replayed {replayed}")
    for j in range(min(same, len(logprobs), len(replay.logprobs))):
        gap = abs(logprobs[j] - replay.logprobs[j])
        check.max_gap = max(check.max_gap, gap)
        if not gap <= check.tolerance:  # a NaN logprob fails too
            check.gaps.append(
                f"{where} {j}: id {ids[j]} logprob stored {logprobs[j]:.6g}, rescored {replay.logprobs[j]:.6g} "
                f"(gap {gap:.3g})"
            )


async def _rescore_row(
    backend: Backend,
    row: RowCheck,
    captures: dict[int, Capture],
    prompts: dict[int, list[int]],
    replays: dict[int, Replay],
    check: RolloutCheck,
) -> None:
    """Each capture's output as ``row`` holds it, against what the engine made of the row's context before it."""
    stored = row.row
    for segment in row.segments:
        capture, replay = captures[segment.capture_id], replays.get(segment.capture_id)
        end = segment.offset + segment.length
        ids, logprobs = stored.response_ids[segment.offset : end], stored.response_logprobs[segment.offset : end]
        if replay is None or not segment.exact:
            continue  # not re-scored, or sampled on a context the row does not hold: its capture's check stands
        if ids == tuple(capture.output_ids) and logprobs == tuple(capture.output_logprobs):
            continue  # the capture's own tokens: its result is the row's
        context = [*stored.prompt_ids, *stored.response_ids[: segment.offset]]
        if context != prompts[capture.id]:
            continue  # the row's context differs from the captures': named by the row check already
        if not replay.greedy and ids != replay.ids:
            sampling = SamplingParams.parse(dict(capture.sampling_params or {}))
            forced = await _replay(backend, context, ids, sampling)
            if forced is None:
                continue
            replay = forced
        _compare(check, ids, logprobs, replay, f"{stored.name} capture {capture.id} position")


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


def summary(checks: Sequence[RolloutCheck], tolerance: float) -> dict[str, Any]:
    """The run's totals: rollouts, failed ones, those with nothing compared (``not_checked``), trajectories."""
    failed = [c.rollout_id for c in checks if c.failed(tolerance)]
    gaps = [c.max_gap for c in checks if c.tokens]
    return {
        "rollouts": len(checks),
        "failed": len(failed),
        "not_checked": sum(1 for c in checks if not c.checked and not c.failed(tolerance)),
        "max_gap": max(gaps, default=0.0),
        "tokens": sum(c.tokens for c in checks),
        "trajectories": sum(c.trajectories for c in checks),
        "tolerance": tolerance,
    }
