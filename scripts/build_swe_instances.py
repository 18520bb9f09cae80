"""SWE-bench-format instances from the history of a small Python project written here (``textkit``).

    python scripts/build_swe_instances.py [--out datasets/swe-mini/instances.jsonl] [--image polar/base:bookworm]

The project's history is made with fixed authors and dates, so its commit ids (and so the instances) are the same
on every machine: an initial commit with three bugs and the tests that already pass, then one commit per fix,
each changing the source and adding the test that shows the bug. Each fix becomes an instance the way SWE-bench
mines pull requests: ``base_commit`` its parent, ``patch`` its source diff, ``test_patch`` its test diff.

Each instance gets an image FROM the base image (never pulled) holding the repository at ``/testbed`` with only
the history up to its base commit (a later fix is not in it), tagged by the ``polar`` template
(``polar-swe/<id>:latest``). ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` are measured, not written down: the tests run
in that image with the test patch alone and again with the gold patch too (pytest ``-rA``, parsed by swebench's
``parse_log_pytest``). The JSONL carries SWE-bench 5's ``eval_script``, ``log_parser`` and ``eval_type``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = "polar-example/textkit"
DATE = "2026-01-0{day}T12:00:00+00:00"
HEREDOC = "EOF_114329324912"

INITIAL = {
    "README.md": "# textkit\n\nSmall text helpers.\n",
    "textkit/__init__.py": "from textkit.duration import parse_duration\nfrom textkit.slug import slugify\n"
    "from textkit.words import word_count\n\n__all__ = ['parse_duration', 'slugify', 'word_count']\n",
    "textkit/slug.py": 'import re\n\n\ndef slugify(text: str) -> str:\n    """"Hello World!" -> "hello-world"."""\n'
    '    text = re.sub(r"[^a-z0-9]", "-", text.lower())\n    return text.strip("-")\n',
    "textkit/words.py": 'def word_count(text: str) -> int:\n    """The number of whitespace-separated words."""\n'
    '    return len(text.split(" "))\n',
    "textkit/duration.py": "import re\n\n\n"
    'def parse_duration(text: str) -> int:\n    """"1h30m" -> 5400 (seconds)."""\n'
    '    match = re.fullmatch(r"(?:(\\d+)h)?(?:(\\d+)m)?(?:(\\d+)s)?", text.strip())\n'
    '    if not match or not text.strip():\n        raise ValueError(f"not a duration: {text!r}")\n'
    "    hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())\n"
    "    return hours * 3600 + minutes + seconds\n",
    "tests/test_slug.py": "from textkit import slugify\n\n\ndef test_simple():\n"
    '    assert slugify("Hello World") == "hello-world"\n',
    "tests/test_words.py": "from textkit import word_count\n\n\ndef test_simple():\n"
    '    assert word_count("one two three") == 3\n',
    "tests/test_duration.py": "import pytest\n\nfrom textkit import parse_duration\n\n\ndef test_hours():\n"
    '    assert parse_duration("2h") == 7200\n\n\ndef test_seconds():\n    assert parse_duration("45s") == 45\n\n\n'
    'def test_bad():\n    with pytest.raises(ValueError):\n        parse_duration("soon")\n',
}

# (instance suffix, problem statement, source change, test addition)
FIXES = [
    (
        "1",
        "slugify() leaves runs of dashes: slugify('Hello,  World!') returns 'hello---world' instead of "
        "'hello-world'. Consecutive separators should become a single dash.",
        ("textkit/slug.py", 'r"[^a-z0-9]", "-"', 'r"[^a-z0-9]+", "-"'),
        (
            "tests/test_slug.py",
            '\n\ndef test_runs_of_separators():\n    assert slugify("Hello,  World!") == "hello-world"\n',
        ),
    ),
    (
        "2",
        "word_count() miscounts text with several spaces, tabs or newlines between words, and returns 1 for an "
        "empty string. word_count('') should be 0 and word_count('a  b\\tc\\n') should be 3.",
        ("textkit/words.py", 'len(text.split(" "))', "len(text.split())"),
        (
            "tests/test_words.py",
            '\n\ndef test_whitespace():\n    assert word_count("a  b\\tc\\n") == 3\n\n\ndef test_empty():\n'
            '    assert word_count("") == 0\n',
        ),
    ),
    (
        "3",
        "parse_duration('1h30m') returns 3630 instead of 5400: minutes are counted as seconds.",
        ("textkit/duration.py", "hours * 3600 + minutes + seconds", "hours * 3600 + minutes * 60 + seconds"),
        ("tests/test_duration.py", '\n\ndef test_minutes():\n    assert parse_duration("1h30m") == 5400\n'),
    ),
]


def git(repo: Path, *args: str, day: int = 1) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Polar",
        "GIT_AUTHOR_EMAIL": "polar@example.invalid",
        "GIT_COMMITTER_NAME": "Polar",
        "GIT_COMMITTER_EMAIL": "polar@example.invalid",
        "GIT_AUTHOR_DATE": DATE.format(day=day),
        "GIT_COMMITTER_DATE": DATE.format(day=day),
    }
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True).stdout


def make_history(repo: Path) -> list[dict[str, str]]:
    """The project's commits; returns one record per fix: base commit, fix commit, patch and test patch."""
    git(repo, "init", "-q", "-b", "main")
    for path, text in INITIAL.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "textkit: slugify, word_count, parse_duration")
    fixes = []
    for day, (suffix, statement, (src, old, new), (test, added)) in enumerate(FIXES, start=2):
        base = git(repo, "rev-parse", "HEAD").strip()
        text = (repo / src).read_text()
        assert old in text, (src, old)
        (repo / src).write_text(text.replace(old, new))
        (repo / test).write_text((repo / test).read_text() + added)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"fix #{suffix}", day=day)
        fix = git(repo, "rev-parse", "HEAD").strip()
        fixes.append(
            {
                "suffix": suffix,
                "statement": statement,
                "base": base,
                "fix": fix,
                "patch": git(repo, "diff", base, fix, "--", src),
                "test_patch": git(repo, "diff", base, fix, "--", test),
                "test_file": test,
                "day": str(day),
            }
        )
    return fixes


def eval_script(base: str, test_patch: str, test_files: list[str]) -> str:
    """SWE-bench's eval.sh shape: test files reset, test patch applied, tests between the markers, reset again."""
    files = " ".join(test_files)
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "cd /testbed",
            f"git checkout {base} {files}",
            f"git apply -v - <<'{HEREDOC}'",
            test_patch.rstrip("\n"),
            HEREDOC,
            ": '>>>>> Start Test Output'",
            f"python3 -m pytest -rA -p no:cacheprovider {files}",
            ": '>>>>> End Test Output'",
            f"git checkout {base} {files}",
            "",
        ]
    )


def build_image(client, repo: Path, base: str, tag: str, from_image: str) -> None:
    """An image with the repository at /testbed holding only the history up to ``base``."""
    with tempfile.TemporaryDirectory() as tmp:
        git(repo, "branch", "-f", "snapshot", base)
        git(repo, "bundle", "create", "-q", str(Path(tmp) / "repo.bundle"), "snapshot")
        dockerfile = (
            f"FROM {from_image}\nCOPY repo.bundle /tmp/repo.bundle\n"
            f"RUN git clone -q -b snapshot /tmp/repo.bundle /testbed && cd /testbed && git checkout -q -B main {base} "
            "&& git branch -D snapshot && git remote remove origin && rm /tmp/repo.bundle\n"
            f'LABEL polar.base_commit="{base}"\nWORKDIR /testbed\n'
        )
        (Path(tmp) / "Dockerfile").write_text(dockerfile)
        client.images.build(path=tmp, tag=tag, rm=True, forcerm=True, pull=False, network_mode="none")


def run_tests(client, image: str, patches: list[str], test_files: list[str]) -> dict[str, str]:
    """The pytest status map in ``image`` with ``patches`` applied (swebench's parse_log_pytest)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for index, patch in enumerate(patches):
            data = patch.encode()
            info = tarfile.TarInfo(f"p{index}.patch")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    applies = " && ".join(f"git apply /patches/p{i}.patch" for i in range(len(patches))) or "true"
    command = f"{applies} && python3 -m pytest -rA -p no:cacheprovider {' '.join(test_files)}; true"
    container = client.containers.create(image, ["bash", "-c", command], network_mode="none")
    try:
        container.put_archive("/", _dir_tar("patches", buffer.getvalue()))
        container.start()
        container.wait(timeout=300)
        log = container.logs().decode()
    finally:
        container.remove(force=True)
    return PARSER_REGISTRY["parse_log_pytest"](log, None)


def _dir_tar(folder: str, inner: bytes) -> bytes:
    """``inner`` (a tar of files) re-rooted under ``folder``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(inner)) as source, tarfile.open(fileobj=out, mode="w") as target:
        directory = tarfile.TarInfo(folder)
        directory.type, directory.mode = tarfile.DIRTYPE, 0o755
        target.addfile(directory)
        for member in source.getmembers():
            data = source.extractfile(member)
            member.name = f"{folder}/{member.name}"
            target.addfile(member, data)
    return out.getvalue()


def build(out: Path, from_image: str) -> list[dict]:
    import docker

    client = docker.from_env()
    instances = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "textkit"
        repo.mkdir()
        for fix in make_history(repo):
            instance_id = f"polar-example__textkit-{fix['suffix']}"
            tag = f"polar-swe/{instance_id.lower().replace('__', '_1776_')}:latest"
            build_image(client, repo, fix["base"], tag, from_image)
            files = [fix["test_file"]]
            before = run_tests(client, tag, [fix["test_patch"]], files)
            after = run_tests(client, tag, [fix["test_patch"], fix["patch"]], files)
            fail_to_pass = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) != "PASSED")
            pass_to_pass = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED")
            if not fail_to_pass:
                raise SystemExit(f"{instance_id}: no test goes from failing to passing: {before} -> {after}")
            instances.append(
                {
                    "instance_id": instance_id,
                    "repo": REPO,
                    "base_commit": fix["base"],
                    "patch": fix["patch"],
                    "test_patch": fix["test_patch"],
                    "problem_statement": fix["statement"],
                    "hints_text": "",
                    "created_at": DATE.format(day=fix["day"]),
                    "version": "0.1",
                    "environment_setup_commit": fix["base"],
                    "FAIL_TO_PASS": fail_to_pass,
                    "PASS_TO_PASS": pass_to_pass,
                    "image": tag,
                    "eval_script": eval_script(fix["base"], fix["test_patch"], files),
                    "log_parser": "parse_log_pytest",
                    "eval_type": "pass_and_fail",
                }
            )
            print(f"{instance_id}: image {tag}, FAIL_TO_PASS {fail_to_pass}, PASS_TO_PASS {pass_to_pass}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(instance, sort_keys=True) + "\n" for instance in instances))
    print(f"wrote {len(instances)} instances to {out}")
    return instances


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("datasets/swe-mini/instances.jsonl"))
    parser.add_argument("--image", default=os.environ.get("POLAR_DOCKER_IMAGE", "polar/base:bookworm"))
    args = parser.parse_args(argv)
    build(args.out, args.image)
    return 0


if __name__ == "__main__":
    sys.exit(main())
