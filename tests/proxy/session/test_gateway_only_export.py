"""A gateway-only session (no task: the user's own orchestrator drives the official openai SDK) reaches trainers:
closed, its trajectories build, ``polar export`` writes them (task columns null) and the control API lists them
with their rollout."""

from __future__ import annotations

import json

import openai

from db import make_engine, make_session_factory
from polar.api.queries import list_trajectories
from polar.cli import main
from polar.export import ExportFilter
from polar.settings import get_settings
from polar.trajectory import rebuild


def test_a_gateway_only_session_rebuilds_exports_and_is_listed(gateway, tmp_path, monkeypatch) -> None:
    session = gateway.session()
    sid = session["session_id"]
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    messages: list[dict] = [{"role": "user", "content": "Say something."}]
    for turn in range(2):
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""}]
        messages += [{"role": "user", "content": f"Again, turn {turn}."}]
    gateway.close_session(sid)

    factory = make_session_factory(make_engine(gateway.settings.database_url))
    report = rebuild(factory, builder="prefix_merge", rollout_id=sid)
    assert [r.rollout_id for r in report.rebuilt] == [sid]

    out = tmp_path / "rl.jsonl"
    monkeypatch.setenv("POLAR_DATABASE_URL", gateway.settings.database_url)
    monkeypatch.setenv("POLAR_HOME", str(gateway.settings.home))
    get_settings.cache_clear()  # an earlier test in this process may have read the settings already
    try:
        assert main(["export", str(out)]) in (0, None)
    finally:
        get_settings.cache_clear()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [sid]
    (row,) = rows
    assert row["task_id"] is None and row["n_loss_tokens"] > 0 and sum(row["loss_mask"]) == row["n_loss_tokens"]

    with factory() as db:
        listed = list_trajectories(db, ExportFilter(rollout_id=sid, all_builders=True), limit=10, offset=0, tokens=True)
    assert [t["rollout_id"] for t in listed] == [sid] and listed[0]["response_ids"] == row["response_ids"]
