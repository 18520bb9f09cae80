"""The prompt an engine receives from the gateway is the one its capture stores, call after call of an agent's
chain, though after the first call only each turn's new ids are encoded (the session's line keeps the rest as JSON
text, ``polar.proxy.session.call_node.Line``): through SGLang's wire format to ``polar serve-model``, streamed and
not, with a branch off the chain (encoded whole) between. Until that branch the session holds its ids only as that
text: nothing reads them back."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from polar.models.engine import LocalEngine
from polar.proxy.call.plan import Planner
from polar.proxy.session.call_node import Line
from polar.serving.sglang_app import create_app
from polar.serving.threaded import ServerThread
from tests.proxy.gateway_server import GatewayServer, settings_for


@pytest.fixture
def sent(engine: LocalEngine, monkeypatch) -> list[list[int]]:
    """The prompt ids of every generation the engine runs, in order."""
    seen: list[list[int]] = []
    stream = engine.stream

    def recording(request, *args, **kwargs):
        seen.append(list(request.input_ids))
        return stream(request, *args, **kwargs)

    monkeypatch.setattr(engine, "stream", recording)
    return seen


@pytest.fixture
def texts(monkeypatch) -> list[bool]:
    """For each planned call, whether its prompt went out as the line's text and its new ids."""
    seen: list[bool] = []
    build = Planner._build

    def recording(self, *args, **kwargs):
        plan = build(self, *args, **kwargs)
        seen.append(plan.ids_text is not None)
        return plan

    monkeypatch.setattr(Planner, "_build", recording)
    return seen


@pytest.fixture
def gateway(engine: LocalEngine, tmp_path, cache_dir) -> Iterator[GatewayServer]:
    with ServerThread(create_app(engine, served_model_name="tiny")) as server:
        settings = settings_for(tmp_path, cache_dir, backend="sglang", backend_url=server.url, model="tiny")
        with GatewayServer(settings) as gw:
            yield gw


def test_each_prompt_the_engine_receives_is_the_stored_one(gateway, sent, texts):
    session = gateway.session()

    def line() -> Line:
        history = gateway.gateway.histories.cached(session["session_id"])
        assert history is not None
        return history.line

    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=session["api_key"], max_retries=0)
    messages: list = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    before: list = []
    for turn in range(6):
        before.append(list(messages))
        stream = turn % 2 == 1
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, stream=stream)
        content = (
            "".join(c.choices[0].delta.content or "" for c in reply) if stream else reply.choices[0].message.content
        )
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"next {turn}"}]
        if turn == 3:  # a branch from the second call: not the line's tip
            # Till then the session's ids are held once, as the JSON text they were sent as: nothing read them back.
            assert not line().ids_read and len(line()) > 0
            client.chat.completions.create(model="tiny", messages=[*before[1], {"role": "user", "content": "x"}])
            # The branch's parent is the root: its prompt, a short stretch of the line, was read from its piece alone.
            assert not line().ids_read
    stored = [row["prompt_ids"] for row in gateway.captures(session["session_id"])]
    assert sent == stored and len(stored) == 7
    # The root and the branch are encoded whole; every other call extends the line's tip (the branch is off it).
    assert texts == [False, True, True, True, False, True, True]
