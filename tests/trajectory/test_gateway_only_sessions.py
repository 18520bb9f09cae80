"""A gateway-only session (no task; the caller's own orchestrator) is finished by closing it, so its trajectories
build; ``polar trajectories rebuild`` prints why it skips anything."""

from __future__ import annotations

from db import Rollout, make_engine, make_session_factory, migrate
from db.enums import RolloutStatus
from polar.cli import main
from polar.proxy.session.sessions import SessionStore
from polar.trajectory import rebuild


def test_closing_a_gateway_only_session_finishes_it_and_rebuild_explains_skips(tmp_path, capsys) -> None:
    url = f"sqlite:///{tmp_path / 'polar.db'}"
    migrate.upgrade(url)
    factory = make_session_factory(make_engine(url))
    sessions = SessionStore(factory)
    open_one, _ = sessions.create()
    closed, _ = sessions.create()
    sessions.close(closed.id)
    with factory() as db:
        assert db.get(Rollout, closed.id).status is RolloutStatus.COMPLETED
        assert db.get(Rollout, closed.id).finished_at is not None
        assert db.get(Rollout, open_one.id).status is RolloutStatus.RUNNING
    report = rebuild(factory, builder="prefix_merge", rollout_id=closed.id)
    assert [r.rollout_id for r in report.rebuilt] == [closed.id] and not report.skipped
    assert main(["trajectories", "rebuild", "--rollout", open_one.id, "--url", url]) == 0
    out = capsys.readouterr().out
    assert f"skipped {open_one.id}: rollout is RUNNING, not finished" in out
