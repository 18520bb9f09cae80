"""``polar verify`` on trajectories captured from the local engine: twenty greedy sessions through the gateway
re-fed to the local backend (the CLI builds it from the settings, a second engine over the same folder) reproduce
every id, with a largest logprob gap within 1e-5; one stored sampled id changed in the database is reported and
fails the run. Sampled captures are rescored teacher-forced (``token_ids_logprob``).

What the trainer reads is checked too, through the CLI: built ``trajectories`` rows (both builders) pass; a row
with a flipped response id, a changed mask bit or a shifted logprob fails with exit 1, naming the trajectory, the
capture and the position; a sampled capture's id changed in the database is named by capture and position with
no later call to reveal it; an empty session prints "not checked"; an unknown rollout or a negative tolerance is a
usage error (exit 2)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import sqlalchemy as sa

from db import Capture, Trajectory, make_engine, make_session_factory, session_scope
from polar.backends.local import LocalBackend
from polar.cli import main
from polar.settings import get_settings
from polar.trajectory import rebuild
from polar.trajectory.verify import load_captures, verify_rollout
from tests.proxy.gateway_server import GatewayServer, settings_for

SESSIONS = 20


def _session(gateway: GatewayServer, temperature: float) -> str:
    session = gateway.session()
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    messages: list = [{"role": "user", "content": "Say something."}]
    for turn in range(2):
        reply = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=6, temperature=temperature
        ).choices[0]
        messages += [
            {"role": "assistant", "content": reply.message.content or ""},
            {"role": "user", "content": f"{turn}"},
        ]
    return session["session_id"]


@pytest.fixture(scope="module")
def store(tmp_path_factory, cache_dir: Path, engine) -> tuple[Path, str, list[str]]:
    tmp = tmp_path_factory.mktemp("verify")
    settings = settings_for(tmp, cache_dir)
    with GatewayServer(settings, backend=LocalBackend(engine)) as gateway:
        sampled = _session(gateway, 0.8)
        greedy = [_session(gateway, 0.0) for _ in range(SESSIONS)]
    return tmp, settings.resolved_database_url, [sampled, *greedy]


@contextlib.contextmanager
def second_id_changed(url: str, query: sa.Select[tuple[Capture]]) -> Iterator[tuple[int, int, int, dict[str, Any]]]:
    """The second sampled id of the first capture ``query`` selects, changed in the store for the block and restored
    after: yields the capture's id, the id it sampled, the id stored instead and its sampling params."""
    factory = make_session_factory(make_engine(url))
    with session_scope(factory) as db:
        capture = db.scalars(query).first()
        assert capture is not None
        ids = list(capture.output_ids)
        original, ids[1] = ids[1], (ids[1] + 1) % 100
        capture.output_ids = ids
        capture_id, sampling = capture.id, dict(capture.sampling_params)
    try:
        yield capture_id, original, ids[1], sampling
    finally:
        with session_scope(factory) as db:
            db.get(Capture, capture_id).output_ids = [*ids[:1], original, *ids[2:]]


def _verify(monkeypatch, capsys, tmp: Path, cache_dir: Path, url: str, *args: str) -> tuple[int, str]:
    monkeypatch.setenv("POLAR_HOME", str(tmp))
    monkeypatch.setenv("POLAR_CACHE", str(cache_dir))
    get_settings.cache_clear()
    try:
        code = main(["verify", "--url", url, "--backend", "local", *args])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    finally:
        get_settings.cache_clear()
    return code, capsys.readouterr().out


def test_twenty_greedy_trajectories_reproduce_within_1e_5(store, monkeypatch, capsys, cache_dir) -> None:
    tmp, url, _ = store
    code, out = _verify(monkeypatch, capsys, tmp, cache_dir, url, "--limit", str(SESSIONS))
    print(out)
    totals = json.loads(out.strip().splitlines()[-1])
    assert code == 0, out
    assert totals["rollouts"] == SESSIONS and totals["failed"] == 0 and totals["tokens"] > 0
    assert totals["max_gap"] <= 1e-5
    assert out.count("ok ") == SESSIONS and "mismatch(es)" in out


async def test_a_sampled_capture_is_rescored_teacher_forced(store, engine) -> None:
    tmp, url, (sampled, *_) = store
    factory = make_session_factory(make_engine(url))
    with session_scope(factory) as db:
        captures = load_captures(db, sampled)
        for row in captures:
            db.expunge(row)
    assert all(c.sampling_params.get("temperature") == 0.8 for c in captures)
    check = await verify_rollout(LocalBackend(engine), sampled, captures)
    print(check.line(1e-5))
    assert check.tokens > 0 and not check.unchecked and not check.mismatches
    assert check.max_gap <= 1e-5


def test_a_corrupted_stored_id_is_reported(store, monkeypatch, capsys, cache_dir) -> None:
    tmp, url, rollouts = store
    target = rollouts[-1]
    first = sa.select(Capture).where(Capture.rollout_id == target).order_by(Capture.seq)
    with second_id_changed(url, first) as (capture_id, original, changed, _):
        code, out = _verify(monkeypatch, capsys, tmp, cache_dir, url, "--rollout", target)
    print(out)
    assert code == 1
    assert f"capture {capture_id} position 1: stored {changed}, replayed {original}" in out
    assert out.startswith(f"FAIL {target}") and "1 token mismatch(es)" in out


@pytest.fixture(scope="module")
def built(tmp_path_factory, cache_dir: Path, engine) -> tuple[Path, str, dict[str, str]]:
    """Closed sessions (a greedy and a sampled one) with trajectories built by both builders, and an empty one."""
    tmp = tmp_path_factory.mktemp("verify-rows")
    settings = settings_for(tmp, cache_dir)
    with GatewayServer(settings, backend=LocalBackend(engine)) as gateway:
        sessions = {"greedy": _session(gateway, 0.0), "sampled": _session(gateway, 0.8)}
        sessions["empty"] = gateway.session()["session_id"]
        for session_id in sessions.values():
            gateway.close_session(session_id)
    factory = make_session_factory(make_engine(settings.resolved_database_url))
    for builder in ("prefix_merge", "per_request"):
        for name in ("greedy", "sampled"):
            assert rebuild(factory, builder=builder, rollout_id=sessions[name]).rebuilt
    return tmp, settings.resolved_database_url, sessions


def _summary(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_stored_trajectories_are_re_fed_and_pass(built, monkeypatch, capsys, cache_dir) -> None:
    tmp, url, sessions = built
    for name in ("greedy", "sampled"):
        code, out = _verify(monkeypatch, capsys, tmp, cache_dir, url, "--rollout", sessions[name])
        assert code == 0, out
        # prefix_merge: one chain of two calls; per_request: one row per call.
        assert out.startswith(f"ok {sessions[name]}: 2 captures") and "3 trajectories (0 disagreement(s)" in out
        assert _summary(out)["trajectories"] == 3 and _summary(out)["max_gap"] <= 1e-5, out


def _corrupt_row(url: str, rollout_id: str, change: str) -> tuple[int, int, int, str, Callable[[], None]]:
    """Corrupt the greedy session's merged row (``change``) at its second call's output position 1, or (``mask on
    inserted``) at the first token inserted after its first call; return the row id, the capture id, the response
    position, the expected line and a function that puts the row back."""
    factory = make_session_factory(make_engine(url))
    with session_scope(factory) as db:
        row = db.scalars(
            sa.select(Trajectory).where(Trajectory.rollout_id == rollout_id, Trajectory.builder == "prefix_merge")
        ).one()
        first, second = (db.get(Capture, capture_id) for capture_id in row.capture_ids)
        saved = {"ids": list(row.response_ids), "mask": list(row.loss_mask), "lp": list(row.response_logprobs)}
        at = len(row.response_ids) - len(second.output_ids) + 1
        name = f"trajectory {row.id} (prefix_merge chain 0)"
        if change == "response id":
            ids = list(row.response_ids)
            ids[at] = (ids[at] + 1) % 100
            row.response_ids = ids
            expected = (
                f"{name} capture {second.id} position 1: stored id {ids[at]}, its captures give {saved['ids'][at]}"
            )
        elif change == "mask bit":
            mask = list(row.loss_mask)
            assert mask[at] == 1
            mask[at] = 0
            row.loss_mask = mask
            expected = f"{name} capture {second.id} position 1: mask stored 0, the builder gives 1"
        elif change == "mask on inserted":
            at = len(first.output_ids)
            mask = list(row.loss_mask)
            assert mask[at] == 0
            mask[at] = 1
            row.loss_mask = mask
            expected = f"{name} response position {at} (inserted before capture {second.id}): mask stored 1"
        else:
            lp = list(row.response_logprobs)
            lp[at] -= 0.5
            row.response_logprobs = lp
            expected = f"{name} capture {second.id} position 1: logprob stored"
        row_id = row.id

    def restore() -> None:
        with session_scope(factory) as db:
            back = db.get(Trajectory, row_id)
            back.response_ids, back.loss_mask, back.response_logprobs = saved["ids"], saved["mask"], saved["lp"]

    return row_id, second.id, at, expected, restore


@pytest.mark.parametrize("change", ["response id", "mask bit", "mask on inserted", "logprob"])
def test_a_corrupted_trajectories_row_fails_naming_trajectory_capture_and_position(
    built, monkeypatch, capsys, cache_dir, change
) -> None:
    tmp, url, sessions = built
    rollout_id = sessions["greedy"]
    row_id, capture_id, _, expected, restore = _corrupt_row(url, rollout_id, change)
    try:
        code, out = _verify(monkeypatch, capsys, tmp, cache_dir, url, "--rollout", rollout_id)
    finally:
        restore()
    print(out)
    assert code == 1, out
    assert out.startswith(f"FAIL {rollout_id}") and expected in out
    assert _summary(out)["failed"] == 1
    if change == "response id":  # the engine re-scores the row's own tokens: its greedy replay disagrees too
        assert f"trajectory {row_id} (prefix_merge chain 0) capture {capture_id} position 1: stored" in out
        assert "replayed" in out
    if change == "logprob":  # and names the gap against the engine, by position
        assert f"trajectory {row_id} (prefix_merge chain 0) capture {capture_id} position 1: id" in out
        assert "rescored" in out


def test_a_corrupted_sampled_id_is_named_without_a_later_call(built, monkeypatch, capsys, cache_dir) -> None:
    """The sampled session's last call (no call after it replays or echoes it): its stored id changed is named by
    capture and position, against the engine (teacher-forced) and against the rows built before the change."""
    tmp, url, sessions = built
    rollout_id = sessions["sampled"]
    last = sa.select(Capture).where(Capture.rollout_id == rollout_id).order_by(Capture.seq.desc())
    with second_id_changed(url, last) as (capture_id, original, changed, sampling):
        assert sampling.get("temperature") == 0.8
        code, out = _verify(monkeypatch, capsys, tmp, cache_dir, url, "--rollout", rollout_id)
    print(out)
    assert code == 1 and out.startswith(f"FAIL {rollout_id}"), out
    assert f"  capture {capture_id} position 1: id {changed} logprob stored" in out  # the engine disagrees
    assert f"capture {capture_id} position 1: stored id {original}, its captures give {changed}" in out  # the rows


def test_an_empty_session_is_not_checked_and_usage_errors_exit_2(built, monkeypatch, capsys, cache_dir) -> None:
    tmp, url, sessions = built
    code, out = _verify(monkeypatch, capsys, tmp, cache_dir, url, "--rollout", sessions["empty"])
    print(out)
    assert code == 0, out
    assert out.startswith(f"not checked {sessions['empty']}: nothing compared") and "ok " not in out
    totals = _summary(out)
    assert totals["rollouts"] == 1 and totals["not_checked"] == 1 and totals["failed"] == 0
    for args in (["--rollout", "no-such-rollout"], ["--tolerance", "-1"]):
        code, _ = _verify(monkeypatch, capsys, tmp, cache_dir, url, *args)
        assert code == 2, args
