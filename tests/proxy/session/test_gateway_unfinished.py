"""The rollout-level outcome through the public interfaces: a gateway-only session driven by the official openai SDK,
closed (COMPLETED), rebuilt with ``polar trajectories rebuild`` and read back with ``polar trajectories stats`` and
``polar export``.

When the session's last main call has no clean answer (here: the client edited the model's reply before its last
call, so that call is poisoned), the outcome reward was earned by an end that is not on record: no token of the
rollout trains, each trajectory says why (``last_call_poisoned``) and the stats count the tokens that reason took.
The same session without the edit trains.
"""

from __future__ import annotations

import json

import openai
import pytest

from polar.cli import main
from polar.settings import get_settings


@pytest.fixture
def cli(gateway, monkeypatch, capsys):
    monkeypatch.setenv("POLAR_DATABASE_URL", gateway.settings.database_url)
    monkeypatch.setenv("POLAR_HOME", str(gateway.settings.home))
    get_settings.cache_clear()  # an earlier test in this process may have read the settings already

    def run(*argv: str) -> str:
        capsys.readouterr()
        assert main(list(argv)) in (0, None)
        return capsys.readouterr().out

    yield run
    get_settings.cache_clear()


def _session(gateway, *, edit_last: bool) -> str:
    session = gateway.session()
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    messages: list[dict] = [{"role": "user", "content": "Say something."}]
    for turn in range(2):
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
        text = reply.choices[0].message.content or ""
        if edit_last and turn == 1:
            text = "Words the model never wrote."  # the client puts them in the model's mouth
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"Again, turn {turn}."}]
    client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    client.close()
    gateway.close_session(session["session_id"])
    return session["session_id"]


def _exported(cli, tmp_path, sid: str) -> list[dict]:
    out = tmp_path / f"{sid}.jsonl"
    cli("export", str(out))
    return [row for row in map(json.loads, out.read_text().splitlines()) if row["rollout_id"] == sid]


def test_a_session_whose_last_call_is_poisoned_trains_nothing_and_says_why(gateway, cli, tmp_path) -> None:
    sid = _session(gateway, edit_last=True)
    cli("trajectories", "rebuild", "--rollout", sid)

    stats = cli("trajectories", "stats", "--rollout", sid, "--builder", "prefix_merge")
    assert "trainable 0" in stats and "last_call_poisoned" in stats and "poisoned" in stats
    rows = _exported(cli, tmp_path, sid)
    assert rows and all(sum(r["loss_mask"]) == 0 for r in rows)
    assert {r["filter_reason"] for r in rows} == {"last_call_poisoned"}


def test_the_same_session_without_the_edit_trains(gateway, cli, tmp_path) -> None:
    sid = _session(gateway, edit_last=False)
    cli("trajectories", "rebuild", "--rollout", sid)

    (row,) = _exported(cli, tmp_path, sid)
    assert row["filter_reason"] is None and sum(row["loss_mask"]) == row["n_loss_tokens"] > 0
