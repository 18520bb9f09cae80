"""``polar verify`` on trajectories captured from the local engine: twenty greedy sessions through the gateway
re-fed to the local backend (the CLI builds it from the settings, a second engine over the same folder) reproduce
every id, with a largest logprob gap within 1e-5; one stored sampled id changed in the database is reported and
fails the run. Sampled captures are rescored teacher-forced (``token_ids_logprob``)."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
import sqlalchemy as sa

from db import Capture, make_engine, make_session_factory, session_scope
from polar.backends.local import LocalBackend
from polar.cli import main
from polar.settings import get_settings
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
    factory = make_session_factory(make_engine(url))
    with session_scope(factory) as db:
        capture = db.scalars(sa.select(Capture).where(Capture.rollout_id == target).order_by(Capture.seq)).first()
        assert capture is not None
        ids = list(capture.output_ids)
        original = ids[1]
        ids[1] = (original + 1) % 100
        capture.output_ids = ids
        capture_id = capture.id
    try:
        code, out = _verify(monkeypatch, capsys, tmp, cache_dir, url, "--rollout", target)
    finally:
        with session_scope(factory) as db:
            db.get(Capture, capture_id).output_ids = [*ids[:1], original, *ids[2:]]
    print(out)
    assert code == 1
    assert f"capture {capture_id} position 1: stored {ids[1]}, replayed {original}" in out
    assert out.startswith(f"FAIL {target}") and "1 token mismatch(es)" in out
