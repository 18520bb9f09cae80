"""Top-k logprobs and routed experts end to end: the official SDKs (four protocols, streamed and not) through the
gateway to ``polar serve-model`` (SGLang's wire format) over the tiny MoE model, ten turns a session.

Every token of the merged trajectory must carry routed experts equal to what the model computes when re-fed the
whole sequence at once (exactly), and every sampled token its top-k equal to that pass's (ids exactly, logprobs
within 1e-5). A server that drops ``return_routed_experts`` stops the gateway's start.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import numpy as np
import openai
import pytest
import sqlalchemy as sa
import torch
from google import genai
from google.genai import types as gtypes

from db import Capture, session_scope
from polar.errors import ConfigError
from polar.inference import LogprobSemantics
from polar.model_folder import folder_tokenizer, open_model_folder
from polar.models.engine import LocalEngine
from polar.models.moe import logprob_rows, routing_of, top_k_of
from polar.models.tiny import ensure_model_dir
from polar.serving.sglang_app import create_app
from polar.serving.threaded import ServerThread
from polar.trajectory.extras import path_to, stitch, trajectory_extras
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.store import load_capture_records
from tests.proxy.gateway_server import GatewayServer, settings_for

TURNS = 10
K = 4
TEMPERATURE = 0.7
MAX_TOKENS = 6
CAPTURE = {"top_logprobs": K, "routed_experts": True}


@dataclass
class Stack:
    engine: LocalEngine
    gateway: GatewayServer


@pytest.fixture(scope="module")
def moe_engine(cache_dir: Path) -> Iterator[LocalEngine]:
    folder = open_model_folder(ensure_model_dir("tiny-moe", cache_dir))
    engine = LocalEngine(folder.path, folder_tokenizer(folder))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def stack(moe_engine: LocalEngine, tmp_path_factory, cache_dir: Path) -> Iterator[Stack]:
    app = create_app(moe_engine, served_model_name="tiny-moe", enable_return_routed_experts=True)
    with ServerThread(app) as server:
        settings = settings_for(
            tmp_path_factory.mktemp("extras"),
            cache_dir,
            backend="sglang",
            backend_url=server.url,
            model="tiny-moe",
            capture_extras=f"top_logprobs={K},routed_experts",
        )
        with GatewayServer(settings) as gateway:
            yield Stack(moe_engine, gateway)


def check_session(stack: Stack, session_id: str) -> None:
    """Ten OK captures in one chain; its stitched extras equal one uncached pass over the whole sequence."""
    with session_scope(stack.gateway.gateway.factory) as db:
        captures = db.scalars(sa.select(Capture).where(Capture.rollout_id == session_id).order_by(Capture.seq)).all()
        assert [c.status.value for c in captures] == ["OK"] * TURNS
        assert all(c.parent_id == p.id for p, c in zip(captures, captures[1:], strict=False))
        # Each call stored only the positions its parent lacked: one row per position of the session.
        rows = sum(len(c.routed_experts) for c in captures) // (2 * 2)
        stitched = stitch(path_to(db, captures[-1].id))
        traces = prefix_merge(load_capture_records(db, session_id)).traces
        assert len(traces) == 1 and traces[0].n_inexact_merges == 0
        extras = trajectory_extras(db, traces[0])
    ids = stitched.ids.tolist()
    n = len(ids)
    assert rows == n - 1
    engine = stack.engine
    assert engine.router_tap is not None
    expected = routing_of(engine.model, ids, engine.router_tap.shape)
    assert stitched.routed_experts is not None and stitched.experts_mask is not None
    assert stitched.routed_experts.shape == (n, 2, 2) and stitched.routed_experts.dtype == np.uint8
    # Every position but the unfed last one. The record comes from the engine's cached incremental passes, the
    # expectation from one uncached pass: the same float32 maths in another order, so a router whose top scores
    # are near-tied can choose differently (seen once in CI: one (position, layer) of ~600). A misaligned or
    # shifted record differs almost everywhere, so at most 1% may differ, no more.
    differ = (stitched.routed_experts[:-1] != expected[:-1]).any(axis=-1)  # (positions, layers)
    assert differ.sum() <= max(1, differ.size // 100), np.argwhere(differ).tolist()
    assert stitched.experts_mask.sum() == n - 1

    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    rows_lp = logprob_rows(logits[:-1], TEMPERATURE, LogprobSemantics.TEMPERATURE_SCALED, greedy=False)
    top_ids, top_lp = top_k_of(rows_lp, K)  # row p predicts ids[p + 1]
    assert stitched.top_mask is not None and stitched.top_ids is not None and stitched.top_logprobs is not None
    sampled = np.flatnonzero(stitched.top_mask)
    assert len(sampled) == sum(c.n_output for c in captures) and sampled.min() > 0
    # The same float32 maths in another order (cached passes against one uncached pass) can order two logprobs
    # within 1e-5 of each other either way (seen once in 45 runs: a row's 2nd and 3rd). So each stored top-k is
    # checked as what it claims: the model's logprob of every id it names, those ids a top k of the row (none left
    # out beats its k-th by more than the tolerance), best first. A misaligned or shifted record fails all three.
    got_ids, got_lp = stitched.top_ids[sampled], stitched.top_logprobs[sampled]
    expected_rows = rows_lp[sampled - 1].numpy()
    assert np.abs(np.take_along_axis(expected_rows, got_ids.astype(np.int64), axis=1) - got_lp).max() <= 1e-5
    assert np.all(got_lp >= top_lp[sampled - 1][:, -1:] - 1e-5) and np.all(np.diff(got_lp, axis=1) <= 1e-5)
    assert all(len(set(row)) == K for row in got_ids.tolist())
    assert (got_ids == top_ids[sampled - 1]).mean() >= 0.9  # near-ties are rare: almost every id is where expected
    assert np.all(stitched.top_ids[~stitched.top_mask] == -1)

    # The merged trajectory's extras are the same arrays, aligned with its prompt and response.
    assert extras is not None and extras.routed_experts is not None and extras.top_ids is not None
    assert np.array_equal(extras.routed_experts, stitched.routed_experts)
    n_prompt = len(traces[0].prompt_ids)
    assert extras.top_ids.shape == (n - n_prompt, K)
    assert np.array_equal(extras.top_ids, stitched.top_ids[n_prompt:])
    loss = np.asarray(traces[0].loss_mask, bool)
    assert np.all(extras.top_mask[loss])  # every trained token has its top-k


def _openai_chat(session: dict, stream: bool) -> None:
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    messages: list = [{"role": "system", "content": "You are terse."}]
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"Turn {turn}: say something."})
        kwargs = dict(model="tiny-moe", messages=messages, max_tokens=MAX_TOKENS, temperature=TEMPERATURE)
        if stream:
            chunks = list(client.chat.completions.create(**kwargs, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            text = client.chat.completions.create(**kwargs).choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})


def _openai_responses(session: dict, stream: bool) -> None:
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    items: list = []
    for turn in range(TURNS):
        items.append({"role": "user", "content": f"Turn {turn}: say something."})
        kwargs = dict(
            model="tiny-moe",
            input=items,
            instructions="You are terse.",
            max_output_tokens=MAX_TOKENS,
            temperature=TEMPERATURE,
        )
        if stream:  # a reply cut by max_output_tokens ends with response.incomplete, not response.completed
            with client.responses.stream(**kwargs) as s:
                ends = [e.response for e in s if e.type in ("response.completed", "response.incomplete")]
            reply = ends[-1]
        else:
            reply = client.responses.create(**kwargs)
        items += [o.model_dump(exclude_none=True) for o in reply.output]


def _anthropic(session: dict, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=session["base_urls"]["anthropic"], api_key=session["api_key"])
    messages: list = []
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"Turn {turn}: say something."})
        kwargs = dict(
            model="tiny-moe", max_tokens=MAX_TOKENS, system="You are terse.", messages=messages, temperature=TEMPERATURE
        )
        if stream:
            with client.messages.stream(**kwargs) as s:
                reply = s.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})


def _gemini(session: dict, stream: bool) -> None:
    client = genai.Client(
        api_key=session["api_key"], http_options=gtypes.HttpOptions(base_url=session["base_urls"]["gemini"])
    )
    config = gtypes.GenerateContentConfig(
        system_instruction="You are terse.", max_output_tokens=MAX_TOKENS, temperature=TEMPERATURE
    )
    contents: list = []
    for turn in range(TURNS):
        contents.append(gtypes.Content(role="user", parts=[gtypes.Part(text=f"Turn {turn}: say something.")]))
        if stream:
            chunks = list(client.models.generate_content_stream(model="tiny-moe", contents=contents, config=config))
            text = "".join(p.text or "" for c in chunks if c.candidates for p in (c.candidates[0].content.parts or []))
        else:
            reply = client.models.generate_content(model="tiny-moe", contents=contents, config=config)
            text = "".join(p.text or "" for p in (reply.candidates[0].content.parts or []))
        contents.append(gtypes.Content(role="model", parts=[gtypes.Part(text=text)]))


PROTOCOLS = {"openai_chat": _openai_chat, "openai_responses": _openai_responses, "anthropic": _anthropic}
PROTOCOLS["gemini"] = _gemini


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_ten_turns_carry_experts_and_top_k(stack: Stack, protocol: str, stream: bool) -> None:
    session = stack.gateway.session(None, capture=CAPTURE)
    PROTOCOLS[protocol](session, stream)
    check_session(stack, session["session_id"])


def test_a_session_cannot_ask_more_than_was_checked(stack: Stack) -> None:
    import httpx

    reply = httpx.post(
        stack.gateway.url + "/v1/sessions",
        json={"capture": {"top_logprobs": K + 1}},
        headers=stack.gateway.control,
        timeout=10,
    )
    assert reply.status_code == 400
    assert "capture.top_logprobs" in reply.text


def test_a_server_that_drops_routed_experts_stops_the_start(moe_engine: LocalEngine, tmp_path, cache_dir) -> None:
    app = create_app(moe_engine, served_model_name="tiny-moe")  # without --enable-return-routed-experts
    with ServerThread(app) as server:
        settings = settings_for(
            tmp_path,
            cache_dir,
            backend="sglang",
            backend_url=server.url,
            model="tiny-moe",
            capture_extras="top_logprobs=2,routed_experts",
        )
        with pytest.raises(ConfigError, match="routed_experts"):
            with GatewayServer(settings):
                pass


def test_stored_trajectories_carry_them_to_the_api_exports_and_trainers(stack: Stack) -> None:
    from db import Trajectory
    from polar.export.extras import extras_columns
    from polar.integrations.extras import trl_fields
    from polar.integrations.groups import Sample
    from polar.trajectory.extras import extras_from_json, trajectory_extras_view
    from polar.trajectory.store import build_and_store

    session = stack.gateway.session(None, capture=CAPTURE)
    _openai_chat(session, stream=False)
    with session_scope(stack.gateway.gateway.factory) as db:
        build_and_store(db, session["session_id"], outcome_reward=1.0)
    with session_scope(stack.gateway.gateway.factory) as db:
        (trajectory,) = db.scalars(sa.select(Trajectory).where(Trajectory.rollout_id == session["session_id"])).all()
        direct = trajectory_extras(db, trajectory)
        view = trajectory_extras_view(db, trajectory.id)  # GET /v1/trajectories/{id}/extras
        columns = extras_columns(db, trajectory)
        prompt, response, mask = list(trajectory.prompt_ids), list(trajectory.response_ids), list(trajectory.loss_mask)
    assert direct is not None and direct.routed_experts is not None and direct.top_ids is not None
    read = extras_from_json(view)
    assert np.array_equal(read.routed_experts, direct.routed_experts)
    assert np.array_equal(read.top_ids, direct.top_ids) and np.array_equal(read.top_logprobs, direct.top_logprobs)
    n = len(prompt) + len(response)
    assert columns["routed_experts_shape"] == [n, 2, 2] and len(columns["routed_experts"]) == n * 4
    assert columns["top_k"] == K and len(columns["response_top_ids"]) == len(response)
    assert all(len(ids) == K for ids, m in zip(columns["response_top_ids"], mask, strict=True) if m)
    sampled = sum(1 for ids in columns["response_top_ids"] if ids)  # every sampled token, trained or not
    assert sampled >= TURNS and all(len(ids) in (0, K) for ids in columns["response_top_ids"])
    sample = Sample("r", 0, "COMPLETED", prompt, response, mask, [0.0] * len(response), 1.0, None, None, 1)
    fields = trl_fields([sample], [read])
    assert fields["polar_top_ids"][0] == columns["response_top_ids"]
    assert np.array_equal(fields["polar_routed_experts"][0], direct.routed_experts)


def test_polar_verify_replays_the_routing_through_serve_model(stack: Stack, monkeypatch, capsys, cache_dir) -> None:
    """``polar verify`` against ``polar serve-model`` (SGLang's wire): the sampled tokens rescored teacher-forced
    within 1e-5 and every stored routed-experts row reproduced by re-feeding the sequence."""
    import json

    from polar.cli import main
    from polar.settings import get_settings

    session = stack.gateway.session(None, capture=CAPTURE)
    _openai_chat(session, stream=False)
    settings = stack.gateway.settings
    monkeypatch.setenv("POLAR_HOME", str(settings.home))
    monkeypatch.setenv("POLAR_CACHE", str(cache_dir))
    monkeypatch.setenv("POLAR_MODEL", "tiny-moe")
    monkeypatch.setenv("POLAR_CAPTURE_EXTRAS", "routed_experts")
    get_settings.cache_clear()
    try:
        code = main(
            ["verify", "--url", settings.resolved_database_url, "--rollout", session["session_id"]]
            + ["--backend", "sglang", "--backend-url", str(settings.backend_url)]
        )
    finally:
        get_settings.cache_clear()
    out = capsys.readouterr().out
    print(out)
    assert code == 0, out
    assert f"ok {session['session_id']}: {TURNS} captures" in out and "routing reproduced" in out
    assert json.loads(out.strip().splitlines()[-1])["max_gap"] <= 1e-5
