"""SWE-bench-format instances from a Python project's history, the way SWE-bench mines pull requests: each fix
becomes an instance with ``base_commit`` its parent, ``patch`` its source diff, ``test_patch`` its test diff.

    python scripts/build_swe_instances.py [--project textkit|parse] [--out FILE] [--image polar/base:bookworm]

Two projects:
- ``textkit`` (``datasets/swe-mini``): a small project written here, an initial commit with three bugs and the tests
  that already pass, then one commit per fix, each changing the source and adding the test that shows the bug.
- ``parse`` (``datasets/swe-parse``): the real ``parse`` library (PyPI, MIT): its published releases, each sdist
  (pinned by sha256, downloaded once with pip into the cache) committed in order; three bug-fix releases become
  instances, their problem statements written from the project's changelog and issues.
Every commit has a fixed author and date, so the commit ids (and so the instances) are the same on every machine.

Each instance gets an image FROM the base image (never pulled) holding the repository at ``/testbed`` with only
the history up to its base commit (a later fix is not in it), tagged by the ``polar`` template
(``polar-swe/<id>:latest``). ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` are measured, not written down: the tests run
in that image with the test patch alone and again with the gold patch too (pytest ``-rA``, parsed by swebench's
``parse_log_pytest``). The JSONL carries SWE-bench 5's ``eval_script``, ``log_parser`` and ``eval_type``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from polar.tasks.swe_images import build_instance_image

DATE = "2026-01-0{day}T12:00:00+00:00"
PYTEST = "python3 -m pytest -rA -p no:cacheprovider"
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


def git(repo: Path, *args: str, date: str = DATE.format(day=1)) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Polar",
        "GIT_AUTHOR_EMAIL": "polar@example.invalid",
        "GIT_COMMITTER_NAME": "Polar",
        "GIT_COMMITTER_EMAIL": "polar@example.invalid",
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
    }
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True).stdout


def fix_record(repo: Path, suffix: str, statement: str, base: str, fix: str, date: str) -> dict:
    """One instance's commits and diffs: ``patch`` everything outside ``tests/``, ``test_patch`` what is in it."""
    return {
        "suffix": suffix,
        "statement": statement,
        "base": base,
        "fix": fix,
        "patch": git(repo, "diff", base, fix, "--", ".", ":!tests"),
        "test_patch": git(repo, "diff", base, fix, "--", "tests"),
        "test_files": git(repo, "diff", "--name-only", base, fix, "--", "tests").split(),
        "created_at": date,
    }


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
        git(repo, "commit", "-q", "-m", f"fix #{suffix}", date=DATE.format(day=day))
        fix = git(repo, "rev-parse", "HEAD").strip()
        fixes.append(fix_record(repo, suffix, statement, base, fix, DATE.format(day=day)))
    return fixes


PARSE_RELEASES = [  # version, its sdist's sha256, its release date: committed in this order
    ("1.20.1", "09002ca350ad42e76629995f71f7b518670bcf93548bdde3684fd55d2be51975", "2024-01-28"),
    ("1.20.2", "b41d604d16503c79d81af5165155c0b20f6c8d6c559efa66b4b695c3e5a0a0ce", "2024-06-11"),
    ("1.21.0", "937725d51330ffec9c7a26fdb5623baa135d8ba8ed78817ea9523538844e3ce4", "2026-02-05"),
    ("1.21.1", "825e1a88e9d9fb481b8d2ca709c6195558b6eaa97c559ad3a9a20aa2d12815a3", "2026-02-19"),
    ("1.22.0", "d4987d68ccf08b6ba3bf80b5004ff7de61c4337cba2d8350ae5c9925794979d9", "2026-05-02"),
    ("1.22.1", "d3a4740ec3da338e2b258b2d69741b731eadfddca59e24a14bc4ee5fce38c911", "2026-05-26"),
]
PARSE_FIXES = {  # a bug-fix release -> (instance suffix, problem statement): the release before it is the base
    "1.20.2": (
        "1",
        "Field names containing a hyphen are not recognised: parse.search('/local/sub/{user-id}/duration', "
        "'https://dummy_server.com/local/sub/1647222638/duration') returns None, so OpenAPI-style path templates "
        "such as /users/{user-id} cannot be parsed. A field name should be allowed to contain '-': the result is "
        "indexed by the name as written (result['user-id'] == '1647222638'), Parser(template).named_fields names "
        "its group with '_' for '-' (['user_id']), and names that collide that way ({user-id}, {user_id} and "
        "{user.id} in one template) each keep their own value, as '.' already does (user_id, user__id, user___id).",
    ),
    "1.21.1": (
        "2",
        "Parsing ISO 8601 timestamps with {:ti} loses microsecond precision: "
        "parse.parse('{:ti}', '2023-10-14T15:09:08.501902Z')[0].microsecond is 501901, not 501902 (the fraction "
        "goes through a float). The fraction should be read as digits: fewer than six padded with zeros "
        "('.1' -> 100000), more than six truncated ('.1234567' -> 123456).",
    ),
    "1.22.1": (
        "3",
        "A float formatted with precision 0 cannot be parsed back: format(20.0, '.0f') is '20', but "
        "parse.parse('a {:.0f} b', 'a 12 b') and parse.parse('foo_{:02.0f}t', 'foo_20t') return None. With "
        "precision 0 the f and F types should match digits without a decimal point (and, as format never writes "
        "one there, not match '12.0').",
    ),
}


def sdist(version: str, sha256: str) -> Path:
    """``parse``'s sdist of ``version``, downloaded once with pip into Polar's cache folder (``POLAR_CACHE``) and
    checked against ``sha256``."""
    from polar.settings import get_settings

    cache = get_settings().cache_dir / "sdists"
    path = cache / f"parse-{version}.tar.gz"
    if not path.is_file():
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(cache)]
        subprocess.run([*pip, f"parse=={version}"], check=True, capture_output=True, text=True)
    if hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
        raise SystemExit(f"{path}: sha256 is not the pinned {sha256}")
    return path


def parse_history(repo: Path) -> list[dict[str, str]]:
    """``parse``'s releases, one commit each (the sdist less its generated metadata); one record per fix."""
    git(repo, "init", "-q", "-b", "main")
    fixes, previous = [], ""
    for version, sha256, day in PARSE_RELEASES:
        for child in repo.iterdir():
            if child.is_dir() and child.name != ".git":
                shutil.rmtree(child)
            elif child.is_file():
                child.unlink()
        with tarfile.open(sdist(version, sha256)) as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts[1:]  # below the sdist's own top folder
                generated = not parts or parts[0].endswith(".egg-info") or parts in (("PKG-INFO",), ("setup.cfg",))
                if member.isfile() and not generated:
                    relative = Path(*parts)
                    (repo / relative).parent.mkdir(parents=True, exist_ok=True)
                    (repo / relative).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
        date = f"{day}T12:00:00+00:00"
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"parse {version}", date=date)
        head = git(repo, "rev-parse", "HEAD").strip()
        if version in PARSE_FIXES:
            fixes.append(fix_record(repo, *PARSE_FIXES[version], previous, head, date))
        previous = head
    return fixes


@dataclass(frozen=True)
class Project:
    repo: str  # SWE-bench's "owner/name"
    version: str
    history: Callable[[Path], list[dict[str, str]]]
    out: str  # the dataset file it writes by default
    test_command: str = PYTEST  # the test files follow it


PROJECTS = {
    "textkit": Project("polar-example/textkit", "0.1", make_history, "datasets/swe-mini/instances.jsonl"),
    # parse's own pytest options (since 1.22) ask for pytest-cov, which the environment does not have: its test
    # command clears them, as SWE-bench's per-repository specs set their own test commands
    "parse": Project(
        "r1chardj0n3s/parse", "1.20", parse_history, "datasets/swe-parse/instances.jsonl", f"{PYTEST} -o addopts="
    ),
}


def eval_script(base: str, test_patch: str, test_command: str, test_files: list[str]) -> str:
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
            f"{test_command} {files}",
            ": '>>>>> End Test Output'",
            f"git checkout {base} {files}",
            "",
        ]
    )


def run_tests(client, image: str, patches: list[str], test_command: str, test_files: list[str]) -> dict[str, str]:
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
    command = f"{applies} && {test_command} {' '.join(test_files)}; true"
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


def build(out: Path, from_image: str, project: str = "textkit") -> list[dict]:
    import docker

    client = docker.from_env()
    source = PROJECTS[project]
    owner, name = source.repo.split("/")
    instances = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / name
        repo.mkdir()
        for fix in source.history(repo):
            instance_id = f"{owner}__{name}-{fix['suffix']}"
            tag = f"polar-swe/{instance_id.lower().replace('__', '_1776_')}:latest"
            build_instance_image(client, repo, fix["base"], tag, from_image)
            files = fix["test_files"]
            before = run_tests(client, tag, [fix["test_patch"]], source.test_command, files)
            after = run_tests(client, tag, [fix["test_patch"], fix["patch"]], source.test_command, files)
            fail_to_pass = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) != "PASSED")
            pass_to_pass = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED")
            if not fail_to_pass:
                raise SystemExit(f"{instance_id}: no test goes from failing to passing: {before} -> {after}")
            instances.append(
                {
                    "instance_id": instance_id,
                    "repo": source.repo,
                    "base_commit": fix["base"],
                    "patch": fix["patch"],
                    "test_patch": fix["test_patch"],
                    "problem_statement": fix["statement"],
                    "hints_text": "",
                    "created_at": fix["created_at"],
                    "version": source.version,
                    "environment_setup_commit": fix["base"],
                    "FAIL_TO_PASS": fail_to_pass,
                    "PASS_TO_PASS": pass_to_pass,
                    "image": tag,
                    "eval_script": eval_script(fix["base"], fix["test_patch"], source.test_command, files),
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
    parser.add_argument("--project", choices=sorted(PROJECTS), default="textkit")
    parser.add_argument("--out", type=Path, help="default: the project's dataset file")
    parser.add_argument("--image", default=os.environ.get("POLAR_DOCKER_IMAGE", "polar/base:bookworm"))
    args = parser.parse_args(argv)
    build(args.out or Path(PROJECTS[args.project].out), args.image, args.project)
    return 0


if __name__ == "__main__":
    sys.exit(main())
