"""Any real model through the whole gateway: per family with a real vocabulary here, a tiny model folder made by
``polar model init``, served by ``polar serve-model --model-path``, and a ``polar gateway --model-path`` (no toy
setting) in front of it; the official SDKs of all four protocols run a two-turn tool loop through it.

Checked per family: the tool call and the text parse back as the family writes them (expected values are the
family's own round trip of the scripted reply: Llama 3 cannot carry text beside a call, gpt-oss reasons first);
every child call extends its parent token for token (append mode) and, where the sampled ids are the canonical
encoding of what the harness echoes, its prompt equals the family's canonical render of the request; the
merged trajectory is conditioning-exact. One serve-model and one gateway per family (module-scoped).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types as gtypes

from polar.chat import ChatFormat, chat_format_for
from polar.model_folder import open_model_folder
from polar.tokens.messages import user
from polar.tokens.parsers.types import ParsedOutput
from polar.wire import get_codec
from polar.wire.policy import ScriptedReply
from tests.conftest import CONTROL
from tests.proxy.gateway_server import free_port

WRITE = {"name": "write_file", "arguments": {"path": "hello.txt", "content": "hi"}}
REPLIES = [{"content": "I will write it.", "tool_calls": [WRITE]}, {"content": "Done: hello.txt written."}]
SCRIPT = {"type": "scripted", "replies": REPLIES}
SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}
# (tokenizer for ``polar model init``, the family it must be served as)
FAMILIES = [("qwen", "qwen3"), ("deepseek", "deepseek_v3"), ("llama3", "llama3"), ("o200k_harmony", "gpt_oss")]


def _wait(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{url} exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not come up:\n{log.read_text()[-4000:]}")


def _start(argv: list[str], env: dict[str, str], log: Path, probe: str) -> subprocess.Popen:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "polar.cli", *argv], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        _wait(probe, proc, log)
    except BaseException:
        _stop(proc)
        raise
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class FamilyGateway:
    family: str
    folder: Path
    url: str
    database_url: str
    fmt: ChatFormat

    def session(self) -> dict:
        reply = httpx.post(self.url + "/v1/sessions", json={"policy": SCRIPT}, headers=CONTROL, timeout=30)
        reply.raise_for_status()
        return reply.json()

    def captures(self, session_id: str) -> list[dict]:
        reply = httpx.get(
            f"{self.url}/v1/sessions/{session_id}/captures",
            params={"full_prompt": True, "requests": True},
            headers=CONTROL,
            timeout=30,
        )
        reply.raise_for_status()
        return reply.json()["captures"]

    def expected(self, turn: int) -> ParsedOutput:
        """The scripted reply of ``turn`` as this family writes and parses it."""
        message = ScriptedReply.model_validate(REPLIES[turn]).message()
        prompt = self.fmt.render_ids([user("Write hello.txt")])  # ends with the generation prompt it follows
        return self.fmt.parse(self.fmt.reply_ids(message), (), prompt)


@pytest.fixture(scope="module", params=FAMILIES, ids=[f for _, f in FAMILIES])
def served(request, tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[FamilyGateway]:
    tokenizer, family = request.param
    tmp = tmp_path_factory.mktemp(f"family-{family}")
    folder = tmp / f"tiny-{family}"
    env = {**os.environ, "POLAR_CACHE": str(cache_dir), "POLAR_HOME": str(tmp / "home")}
    env.pop("POLAR_MODEL", None)  # no toy setting anywhere
    init = [sys.executable, "-m", "polar.cli", "model", "init", str(folder), "--tokenizer", tokenizer]
    subprocess.run([*init, "--context", "8192"], env=env, check=True, capture_output=True, timeout=600)
    model_port, gateway_port = free_port(), free_port()
    backend = _start(
        ["serve-model", "--model-path", str(folder), "--port", str(model_port), "--log-level", "warning"],
        env,
        tmp / "serve-model.log",
        f"http://127.0.0.1:{model_port}/v1/models",
    )
    database_url = f"sqlite:///{tmp / 'gateway.db'}"
    gateway_env = {
        **env,
        "POLAR_BACKEND": "sglang",
        "POLAR_BACKEND_URL": f"http://127.0.0.1:{model_port}",
        "POLAR_DATABASE_URL": database_url,
        "POLAR_ALLOW_SCRIPTED_POLICIES": "true",
    }
    try:
        gateway = _start(
            ["gateway", "--model-path", str(folder), "--port", str(gateway_port)],
            gateway_env,
            tmp / "gateway.log",
            f"http://127.0.0.1:{gateway_port}/health",
        )
        try:
            fmt = chat_format_for(open_model_folder(folder))
            assert fmt.family == family
            yield FamilyGateway(family, folder, f"http://127.0.0.1:{gateway_port}", database_url, fmt)
        finally:
            _stop(gateway)
    finally:
        _stop(backend)


def check_chain(served: FamilyGateway, session: dict) -> None:
    """Two OK calls; the second extends the first token for token (append mode), equals the family's canonical
    render of its request where the sampled ids are the canonical encoding of the echo, and merges exactly."""
    captures = served.captures(session["session_id"])
    assert [c["status"] for c in captures] == ["OK", "OK"]
    for c in captures:
        assert c["n_output"] == len(c["output_ids"]) == len(c["output_logprobs"]) > 0
        assert c["output_ids"][-1] in served.fmt.stop_ids
    parent, child = captures
    assert child["parent_id"] == parent["id"] and child["render_mode"] == "append"
    sequence = parent["prompt_ids"] + parent["output_ids"]
    assert child["prompt_ids"][: len(sequence)] == sequence  # the sampled ids of turn 1 inside turn 2
    request = get_codec(child["protocol"]).parse_request(child["request"], path_model=child["model"], path_stream=False)
    echoed = next(m for m in request.messages if m.role.value == "assistant")
    if echoed.reasoning == served.expected(0).reasoning:  # the harness echoed everything the model wrote
        assert child["prompt_ids"] == list(served.fmt.render_ids(request.messages, request.tools))

    from db import make_engine, make_session_factory, session_scope
    from polar.trajectory.prefix_merge import prefix_merge
    from polar.trajectory.store import load_capture_records

    engine = make_engine(served.database_url)
    try:
        with session_scope(make_session_factory(engine)) as db:
            stats = prefix_merge(load_capture_records(db, session["session_id"])).stats
    finally:
        engine.dispose()
    assert (stats.traces_out, stats.exact_merges, stats.inexact_merges, stats.break_causes) == (1, 1, 0, {})


def test_models_lists_the_served_folder(served: FamilyGateway) -> None:
    models = httpx.get(served.url + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [served.folder.name]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat(served: FamilyGateway, stream: bool) -> None:
    session = served.session()
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    tools = [{"type": "function", "function": {"name": "write_file", "description": "Write", "parameters": SCHEMA}}]
    messages: list = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Write it"}]
    model = served.folder.name
    first = served.expected(0)
    if stream:
        chunks = list(client.chat.completions.create(model=model, messages=messages, tools=tools, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert text == first.content
        assistant = {
            "role": "assistant",
            "content": text,
            "tool_calls": [
                {
                    "id": calls[0].id,
                    "type": "function",
                    "function": {"name": "write_file", "arguments": calls[0].function.arguments},
                }
            ],
        }
        call_id, arguments = calls[0].id, calls[0].function.arguments
    else:
        choice = client.chat.completions.create(model=model, messages=messages, tools=tools).choices[0]
        assert choice.finish_reason == "tool_calls" and (choice.message.content or "") == first.content
        call_id, arguments = choice.message.tool_calls[0].id, choice.message.tool_calls[0].function.arguments
        assistant = choice.message.model_dump(exclude_none=True)
    assert json.loads(arguments) == WRITE["arguments"]
    messages += [assistant, {"role": "tool", "tool_call_id": call_id, "content": "ok"}]
    second = client.chat.completions.create(model=model, messages=messages, tools=tools).choices[0]
    assert second.message.content == served.expected(1).content
    check_chain(served, session)


def test_openai_responses(served: FamilyGateway) -> None:
    session = served.session()
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    tools = [{"type": "function", "name": "write_file", "description": "Write a file", "parameters": SCHEMA}]
    items: list = [{"role": "user", "content": "Write hello.txt"}]

    def call():
        with client.responses.stream(model="m", input=items, tools=tools, instructions="You are an agent.") as s:
            return s.get_final_response()

    first = call()
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and calls[0].name == "write_file" and json.loads(calls[0].arguments) == WRITE["arguments"]
    assert first.output_text == served.expected(0).content
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": "ok"})
    assert call().output_text == served.expected(1).content
    check_chain(served, session)


def test_anthropic_messages(served: FamilyGateway) -> None:
    session = served.session()
    client = anthropic.Anthropic(base_url=session["base_urls"]["anthropic"], api_key=session["api_key"])
    tools = [{"name": "write_file", "description": "Write a file", "input_schema": SCHEMA}]
    messages: list = [{"role": "user", "content": "Write hello.txt"}]
    kwargs = dict(model="m", max_tokens=256, system="You are an agent.", tools=tools)
    first = client.messages.create(messages=messages, **kwargs)
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "write_file" and use.input == WRITE["arguments"]
    assert "".join(b.text for b in first.content if b.type == "text") == served.expected(0).content
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok"}]},
    ]
    with client.messages.stream(messages=messages, **kwargs) as s:
        second = s.get_final_message()
    assert second.stop_reason == "end_turn"
    assert "".join(b.text for b in second.content if b.type == "text") == served.expected(1).content
    check_chain(served, session)


def test_gemini_generate_content(served: FamilyGateway) -> None:
    session = served.session()
    client = genai.Client(
        api_key=session["api_key"], http_options=gtypes.HttpOptions(base_url=session["base_urls"]["gemini"])
    )
    declaration = gtypes.FunctionDeclaration(name="write_file", description="Write", parameters_json_schema=SCHEMA)
    config = gtypes.GenerateContentConfig(
        system_instruction="You are an agent.",
        tools=[gtypes.Tool(function_declarations=[declaration])],
        automatic_function_calling=gtypes.AutomaticFunctionCallingConfig(disable=True),
    )
    contents: list = [gtypes.Content(role="user", parts=[gtypes.Part(text="Write hello.txt")])]
    parts = [
        p
        for c in client.models.generate_content_stream(model="m", contents=contents, config=config)
        if c.candidates
        for p in (c.candidates[0].content.parts or [])
    ]
    calls = [p.function_call for p in parts if p.function_call]
    assert calls and calls[0].name == "write_file" and calls[0].args == WRITE["arguments"]
    text = "".join(p.text or "" for p in parts if not p.function_call and not p.thought)
    assert text == served.expected(0).content
    response = gtypes.FunctionResponse(name="write_file", response={"output": "ok"})
    contents += [
        gtypes.Content(role="model", parts=parts),
        gtypes.Content(role="user", parts=[gtypes.Part(function_response=response)]),
    ]
    final = client.models.generate_content(model="m", contents=contents, config=config).candidates[0].content.parts
    assert "".join(p.text or "" for p in final if not p.thought) == served.expected(1).content
    check_chain(served, session)
