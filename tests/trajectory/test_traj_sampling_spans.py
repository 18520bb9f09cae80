"""A session that mixes sampling regimes keeps them apart, from the capture to the exports and the trainer adapters.

The official ``openai`` SDK calls the gateway over HTTP three times in one conversation: at temperature 1.0, at 0.3
with top_p 0.9, then greedily (temperature 0). The session closes, ``polar trajectories rebuild`` builds its one
chain and ``polar export`` writes it: the stored trajectory, the RL row and the SFT row carry three sampling spans,
each over exactly the ids that call sampled (its output, at its offset in the response), the greedy one flagged,
every span with the local engine's ``temperature_scaled`` semantics. A trainer adapter that weighs the stored
logprobs at temperature 1 (``polar.integrations.sampling``) trains only the first call's tokens and says why the
others are masked; one at temperature 0.3 and top_p 0.9 only the second's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from db import Capture, make_engine, make_session_factory
from polar.api.queries import list_trajectories
from polar.backends.local import LocalBackend
from polar.cli import main
from polar.export import ExportFilter
from polar.integrations.groups import Sample
from polar.integrations.sampling import TrainerSampling, mask_mismatched
from polar.settings import get_settings
from polar.trajectory.per_request import per_request
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.records import PLACEHOLDER_LOGPROB
from polar.trajectory.sampling import SamplingRange
from tests.proxy.gateway_server import GatewayServer, settings_for
from tests.trajectory.traj_helpers import EOT, RecordTree

CALLS: list[dict[str, Any]] = [{"temperature": 1.0}, {"temperature": 0.3, "top_p": 0.9}, {"temperature": 0.0}]


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, engine: Any) -> Iterator[dict[str, Any]]:
    """One closed three-call session (its id, the store's URL, the gateway's settings)."""
    tmp = tmp_path_factory.mktemp("sampling")
    settings = settings_for(tmp, cache_dir)
    with GatewayServer(settings, backend=LocalBackend(engine)) as gateway:
        opened = gateway.session()
        client = openai.OpenAI(base_url=opened["base_urls"]["openai"], api_key=opened["api_key"])
        messages: list[Any] = [{"role": "user", "content": "Say something."}]
        for turn, sampling in enumerate(CALLS):
            reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, **sampling)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content or ""},
                {"role": "user", "content": f"Again, turn {turn}."},
            ]
        gateway.close_session(opened["session_id"])
    yield {"id": opened["session_id"], "url": settings.resolved_database_url, "settings": settings}


def _cli(monkeypatch: pytest.MonkeyPatch, session: dict[str, Any], *args: str) -> None:
    monkeypatch.setenv("POLAR_DATABASE_URL", session["url"])
    monkeypatch.setenv("POLAR_HOME", str(session["settings"].home))
    get_settings.cache_clear()
    try:
        assert main(list(args)) in (0, None)
    finally:
        get_settings.cache_clear()


@pytest.fixture(scope="module")
def outputs(session: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The session rebuilt and exported through the CLI: the captures, the listed trajectory and both export rows."""
    tmp = tmp_path_factory.mktemp("exports")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _cli(monkeypatch, session, "trajectories", "rebuild", "--rollout", session["id"], "--url", session["url"])
        _cli(monkeypatch, session, "export", str(tmp / "rl.jsonl"))
        _cli(monkeypatch, session, "export", str(tmp / "sft.jsonl"), "--kind", "sft")
        _cli(monkeypatch, session, "export", str(tmp / "rl.parquet"))
    factory = make_session_factory(make_engine(session["url"]))
    with factory() as db:
        captures = db.query(Capture).filter_by(rollout_id=session["id"]).order_by(Capture.seq).all()
        captures = [(c.id, c.sampling_params, c.logprob_semantics, list(c.output_ids)) for c in captures]
        listed = list_trajectories(db, ExportFilter(rollout_id=session["id"]), limit=10, offset=0, tokens=True)
    read = lambda name: [json.loads(line) for line in (tmp / name).read_text().splitlines()]  # noqa: E731
    return {"captures": captures, "listed": listed, "rl": read("rl.jsonl"), "sft": read("sft.jsonl"), "tmp": tmp}


def _expected(outputs: dict[str, Any]) -> list[dict[str, Any]]:
    """Each call's span in the one trace: its sampled ids' positions in the response, and its regime."""
    (row,) = outputs["rl"]
    response = row["response_ids"]
    spans, start = [], 0
    for (_, params, semantics, output), asked in zip(outputs["captures"], CALLS, strict=True):
        # Each call's output sits in the response after the tokens inserted before it.
        start = next(i for i in range(start, len(response)) if response[i : i + len(output)] == output)
        assert params["temperature"] == asked["temperature"] and params["top_p"] == asked.get("top_p", 1.0)
        spans.append(
            {
                "start": start,
                "end": start + len(output),
                "temperature": asked["temperature"],
                "top_p": asked.get("top_p", 1.0),
                "top_k": -1,
                "min_p": 0.0,
                "logprob_semantics": semantics,
                "greedy": asked["temperature"] == 0.0,
            }
        )
        start += len(output)
    return spans


def test_three_regimes_give_three_spans_over_exactly_their_tokens(outputs) -> None:
    assert [c[2] for c in outputs["captures"]] == ["temperature_scaled"] * 3
    (row,) = outputs["rl"]
    assert row["kept"] and row["turn_count"] == 3
    expected = _expected(outputs)
    assert row["sampling_spans"] == expected
    # The spans cover exactly the sampled (trained) tokens.
    covered = [0] * len(row["response_ids"])
    for span in expected:
        covered[span["start"] : span["end"]] = [1] * (span["end"] - span["start"])
    assert covered == row["loss_mask"]
    assert [s["greedy"] for s in row["sampling_spans"]] == [False, False, True]
    (sft,) = outputs["sft"]
    assert sft["sampling_spans"] == expected and sft["response_ids"] == row["response_ids"]
    (listed,) = outputs["listed"]
    assert listed["sampling_spans"] == expected


def test_the_parquet_export_holds_the_same_spans(outputs) -> None:
    import pyarrow.parquet as pq

    (row,) = pq.read_table(outputs["tmp"] / "rl.parquet").to_pylist()
    assert json.loads(row["sampling_spans"]) == _expected(outputs)


def test_an_adapter_weighing_the_logprobs_masks_the_regimes_it_does_not_assume(outputs) -> None:
    (listed,) = outputs["listed"]
    sample = Sample(
        rollout_id=listed["rollout_id"],
        sample_index=0,
        status=listed["status"],
        prompt_ids=listed["prompt_ids"],
        completion_ids=listed["response_ids"],
        loss_mask=listed["loss_mask"],
        logprobs=listed["response_logprobs"],
        reward=1.0,
        weight_version_min=None,
        weight_version_max=None,
        chains=1,
        sampling_spans=listed["sampling_spans"],
    )
    first, second, greedy = _expected(outputs)
    n = lambda span: span["end"] - span["start"]  # noqa: E731

    at_one = mask_mismatched(sample, TrainerSampling(1.0))
    assert at_one.reward == 1.0 and at_one.masked_reason is None
    assert [i for i, m in enumerate(at_one.loss_mask) if m] == list(range(first["start"], first["end"]))
    assert at_one.sampling_masked is not None
    assert f"temperature 0.3, the trainer's 1 ({n(second)})" in at_one.sampling_masked
    assert f"greedy ({n(greedy)})" in at_one.sampling_masked

    cold = mask_mismatched(sample, TrainerSampling(0.3, top_p=0.9))
    assert [i for i, m in enumerate(cold.loss_mask) if m] == list(range(second["start"], second["end"]))

    # Nothing left to train: the sample is masked whole, with the reason.
    nothing = mask_mismatched(sample, TrainerSampling(0.7))
    assert not any(nothing.loss_mask) and nothing.reward is None and nothing.masked_reason == nothing.sampling_masked
    # A trajectory built before the spans were recorded cannot be weighed at all.
    unrecorded = mask_mismatched(Sample(**{**sample.__dict__, "sampling_spans": None}), TrainerSampling(1.0))
    assert unrecorded.reward is None and "not recorded" in (unrecorded.masked_reason or "")


def _regime(temperature: float, n: int, **cut: Any) -> tuple[SamplingRange, ...]:
    return (SamplingRange(0, n, temperature, logprob_semantics="raw", **cut),)


def test_branches_keep_each_path_s_own_spans_and_per_request_keeps_each_call_s() -> None:
    """A call continued twice (at 0.3 with top_k 20, then greedily): each chain holds the root's span and its own
    branch's, never its sibling's; touching spans of one regime join; per_request gives each call its one span."""
    tree = RecordTree()
    root = tree.add([1, 5], [7, 8, EOT], sampling_spans=_regime(1.0, 3))
    cold = tree.add([1, 5, 7, 8, EOT, 6], [9, EOT], root, sampling_spans=_regime(0.3, 2, top_k=20))
    greedy = tree.add([1, 5, 7, 8, EOT, 6, 6], [4, 4, EOT], root, sampling_spans=_regime(0.0, 3))
    same = tree.add([1, 5, 7, 8, EOT, 6, 6, 4, 4, EOT], [3], greedy, sampling_spans=_regime(0.0, 1))
    first, second = prefix_merge(tree.records).traces
    assert first.capture_ids == (root.id, cold.id) and second.capture_ids == (root.id, greedy.id, same.id)
    assert [s.as_json() for s in first.sampling_spans] == [
        {**_regime(1.0, 3)[0].as_json()},
        {**_regime(0.3, 2, top_k=20)[0].as_json(), "start": 4, "end": 6},
    ]
    # The greedy call and its continuation touch (nothing inserted between them) and share a regime: one span.
    assert [(s.start, s.end, s.temperature, s.greedy) for s in second.sampling_spans] == [
        (0, 3, 1.0, False),
        (5, 9, 0.0, True),
    ]
    for trace in (first, second):
        sampled = [i for i, logprob in enumerate(trace.response_logprobs) if logprob != PLACEHOLDER_LOGPROB]
        assert [i for s in trace.sampling_spans for i in range(s.start, s.end)] == sampled
    spans = [t.sampling_spans for t in per_request(tree.records).traces]
    assert spans == [r.sampling_spans for r in tree.records]
