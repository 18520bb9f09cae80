"""The six CLI adapters as data: pins match the install script, config files parse with real parsers and point
every model call at the session, the key is never written to a file, and the tools layout is shared with
``scripts/install_harnesses.sh``."""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from pathlib import Path

import pytest

from harness_adapters import ADAPTERS, get_adapter
from harness_adapters.base import HarnessContext, SessionAccess
from harness_adapters.install import TOOLS
from harness_adapters.python_bundle import python_path, version
from polar.errors import InvalidRequest, SandboxError

REPO = Path(__file__).resolve().parents[2]
CLIS = ("codex", "claude_code", "gemini_cli", "qwen_code", "opencode", "pi")
SESSION = SessionAccess(
    "sid",
    "sk-secret",
    {"openai": "http://127.0.0.1:9/v1", "anthropic": "http://127.0.0.1:9", "gemini": "http://127.0.0.1:9"},
)
CTX = HarnessContext(
    "Do {home} it.", "/r/logs/instruction.md", "/r/work", "/r/home", "/r/logs", "polar-tiny", "/py", "/tools"
)


def test_pins_match_the_install_script():
    script = (REPO / "scripts" / "install_harnesses.sh").read_text()
    pinned = {m[0]: (m[1], m[2], m[3]) for m in re.findall(r'"(\w+)\s+(\S+)\s+(\S+)\s+(\S+)"', script)}
    for name, pin in TOOLS.items():
        if name != "node" and pin.kind == "npm":  # pip tools (mini_swe_agent) are not npm CLIs
            assert pinned[name] == (pin.package, pin.version, pin.binary)


@pytest.mark.parametrize("name", CLIS)
def test_each_cli_points_at_its_session_with_real_serialisers(name):
    adapter = get_adapter(name)
    launch = adapter.launch(adapter.Config.model_validate({"extra_args": ["--x"]}), CTX, SESSION)
    assert launch.argv[0] == str(adapter.pin.executable("/tools"))
    assert launch.argv[-1] == CTX.instruction and launch.argv[-2] == "--x"  # the prompt is never filled in
    urls = set(SESSION.base_urls.values())
    mentioned = {value for value in launch.env.values() if value in urls}
    for path, text in launch.files.items():
        assert path.startswith(CTX.home + "/")
        data = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
        assert SESSION.api_key not in text
        mentioned |= {url for url in urls if url in json.dumps(data)}
    assert mentioned, "the CLI is pointed at the session"
    assert SESSION.api_key in launch.env.values()
    assert launch.env["DO_NOT_TRACK"] == "1" and launch.env["XDG_CONFIG_HOME"] == "/r/home/.config"


def test_the_registry_lists_every_harness_and_rejects_unknown_names():
    assert set(CLIS) | {"agent", "command", "mini_swe_agent"} == set(ADAPTERS)
    with pytest.raises(InvalidRequest, match="known: "):
        get_adapter("cursor")


def test_the_command_harness_tells_its_program_which_sample_it_is():
    adapter = get_adapter("command")
    config = adapter.Config.model_validate({"command": "{python} reply.py", "env": {"TOY": "1"}})
    launch = adapter.launch(config, dataclasses.replace(CTX, sample_index=3), SESSION)
    assert launch.env["POLAR_SAMPLE_INDEX"] == "3" and launch.env["TOY"] == "1"
    assert launch.argv == ("bash", "-c", "/py reply.py")
    assert adapter.launch(config, CTX, SESSION).env["POLAR_SAMPLE_INDEX"] == "0"


def test_claude_code_is_told_the_models_context_window():
    """An unknown model name makes Claude Code 2.1.332 assume 1,000,000 tokens: the session's window goes in
    CLAUDE_CODE_MAX_CONTEXT_TOKENS; a session that does not know it sets nothing; a task's env still wins."""
    adapter = get_adapter("claude_code")
    known = dataclasses.replace(SESSION, context_length=65536)
    assert adapter.launch(adapter.Config(), CTX, known).env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "65536"
    assert "CLAUDE_CODE_MAX_CONTEXT_TOKENS" not in adapter.launch(adapter.Config(), CTX, SESSION).env
    own = adapter.Config.model_validate({"env": {"CLAUDE_CODE_MAX_CONTEXT_TOKENS": "32000"}})
    assert adapter.launch(own, CTX, known).env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "32000"
    other = get_adapter("qwen_code")
    assert not any("CONTEXT" in name for name in other.launch(other.Config(), CTX, known).env)
    assert known.rebased("http://127.0.0.1:9", "http://127.0.0.1:7").context_length == 65536


def test_qwen_code_background_memory_agents_are_off():
    """Qwen Code 0.24.4's memory extraction and dream (on by default) and auto-skill review send calls of their
    own after a turn; the adapter turns them off (tests/e2e/test_harnesses.py checks a run sends none)."""
    adapter = get_adapter("qwen_code")
    (text,) = adapter.launch(adapter.Config(), CTX, SESSION).files.values()
    memory = json.loads(text)["memory"]
    assert memory["enableManagedAutoMemory"] is memory["enableManagedAutoDream"] is memory["enableAutoSkill"] is False


def test_a_session_seen_through_a_tunnel_keeps_its_paths():
    moved = SESSION.rebased("http://127.0.0.1:9", "http://127.0.0.1:7")
    assert moved.base_urls == {
        "openai": "http://127.0.0.1:7/v1",
        "anthropic": "http://127.0.0.1:7",
        "gemini": "http://127.0.0.1:7",
    }


def test_node_22_from_pypi_is_installed_beside_the_clis_once(tmp_path):
    import subprocess

    from harness_adapters.install import TOOLS, install_tool, node_path

    first = install_tool("node", tmp_path)
    assert not first.already and node_path(tmp_path).stat().st_mode & 0o111
    version = subprocess.run([str(node_path(tmp_path)), "--version"], capture_output=True, text=True).stdout
    assert version.strip() == f"v{TOOLS['node'].version}" and int(TOOLS["node"].version.split(".")[0]) >= 22
    assert install_tool("node", tmp_path).already


def test_the_command_line_installs_a_tool_into_polar_tools(tmp_path, monkeypatch, capsys):
    from harness_adapters.install import TOOLS
    from polar.cli import main
    from polar.settings import get_settings

    monkeypatch.setenv("POLAR_HOME", str(tmp_path))
    monkeypatch.setenv("POLAR_TOOLS", str(tmp_path / "tools"))
    get_settings.cache_clear()
    try:
        assert main(["harness", "install", "node"]) == 0
        assert (
            f"node {TOOLS['node'].version}: installed" in capsys.readouterr().out
            and (tmp_path / "tools" / "node" / "bin" / "node").exists()
        )
        with pytest.raises(SystemExit) as exit_info:
            main(["harness", "install", "cursor"])  # argparse lists the known names
        assert exit_info.value.code == 2 and "claude" in capsys.readouterr().err
    finally:
        get_settings.cache_clear()


def test_mini_swe_agent_runs_its_module_against_the_session(tmp_path):
    adapter = get_adapter("mini_swe_agent")
    pin = TOOLS["mini_swe_agent"]
    with pytest.raises(SandboxError, match="polar harness install mini_swe_agent"):
        adapter.launch(adapter.Config(), CTX, SESSION)  # not installed in /tools
    pin.executable(tmp_path).parent.mkdir(parents=True)
    pin.executable(tmp_path).write_text("")
    (pin.prefix(tmp_path) / ".installed").write_text("x")
    ctx = dataclasses.replace(CTX, tools_dir=str(tmp_path))
    with pytest.raises(SandboxError, match="polar harness install mini_swe_agent"):
        adapter.launch(adapter.Config(), ctx, SESSION)  # the tools' Python is missing
    image_python = adapter.Config.model_validate({"python": "python3"})
    assert adapter.launch(image_python, ctx, SESSION).argv[:3] == ("python3", "-m", "minisweagent.run.mini")
    python_path(tmp_path).parent.mkdir(parents=True)
    python_path(tmp_path).write_text("")
    (tmp_path / "python" / "VERSION").write_text(version())
    launch = adapter.launch(adapter.Config.model_validate({"mode": "text", "step_limit": 7}), ctx, SESSION)
    assert launch.argv[:3] == (str(python_path(tmp_path)), "-m", "minisweagent.run.mini")
    assert launch.argv[-1] == CTX.instruction
    assert "mini_textbased.yaml" in launch.argv and "agent.step_limit=7" in launch.argv
    assert f"model.model_kwargs.api_base={SESSION.base_urls['openai']}" in launch.argv
    assert SESSION.api_key not in launch.argv and launch.env["OPENAI_API_KEY"] == SESSION.api_key
    assert launch.env["PYTHONPATH"] == str(pin.site(tmp_path)) and launch.env["MSWEA_CONFIGURED"] == "1"
    tools = adapter.launch(adapter.Config.model_validate({"mode": "tools"}), ctx, SESSION)
    assert "mini.yaml" in tools.argv and "litellm" in tools.argv


def test_the_python_that_pip_tools_run_on_is_copied_into_the_tools_folder_once(tmp_path):
    import subprocess

    from harness_adapters.install import install_tool

    first = install_tool("python", tmp_path)
    assert not first.already and first.path == python_path(tmp_path)
    probe = "import sys, ssl, sqlite3, ctypes, lzma; print(sys.prefix)"
    done = subprocess.run([str(first.path), "-I", "-c", probe], capture_output=True, text=True, env={}, check=True)
    assert done.stdout.strip() == str(tmp_path / "python")  # its own standard library, found from where it is
    assert not list((tmp_path / "python" / "lib").glob("libc.so*"))  # the C library stays the image's
    assert install_tool("python", tmp_path).already
