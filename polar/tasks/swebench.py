"""SWE-bench-style instances (one JSON object per line) as TaskRequests.

An instance (SWE-bench, Verified, Lite, SWE-Gym, SWE-smith, R2E-Gym) names a repository at a base commit, an
issue (``problem_statement``, the agent's instruction), the gold ``patch``, the ``test_patch`` and the tests
that must go from failing to passing (``FAIL_TO_PASS``) or keep passing (``PASS_TO_PASS``). Grading needs the
SWE-bench 5 fields ``eval_script`` and ``log_parser`` (``eval_type`` defaults to ``pass_and_fail``); instances of
older exports without them are refused with the field named, since guessing a repository's test command would
not be the official grading.

Images: the instance's ``image`` field when it has one, else the dataset's naming template (``IMAGE_TEMPLATES``,
or ``--image-template``), filled from the instance. The image's WORKDIR (``/testbed``) becomes the agent's work
folder. The agent never sees the test patch, the eval script or the gold patch: they travel in the evaluator's
config, and the oracle's patch in its own prepare step only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from polar.errors import InvalidRequest
from polar.evaluators.swebench import SWEbenchConfig
from polar.tasks.patches import check_patches

ORACLE_PATCH = ".polar/oracle/gold.patch"

# The published images' names, as each project's tooling builds them ({id_docker}: the id lower-cased with "__"
# written "_1776_", SWE-bench's docker-safe form; {id_s}: "__" written "_s_"). Override with image_template.
IMAGE_TEMPLATES: dict[str, str] = {
    "swebench": "sweb.eval.x86_64.{id_docker}:latest",
    "swe-gym": "xingyaoww/sweb.eval.x86_64.{id_s}:latest",
    "swe-smith": "jyangballin/swesmith.x86_64.{owner}_1776_{name}.{commit8}:latest",
    "r2e-gym": "namanjain12/{name}_final:{base_commit}",
    "polar": "polar-swe/{id_docker}:latest",
}
REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch", "FAIL_TO_PASS")


def image_name(instance: dict[str, Any], template: str) -> str:
    """``template`` filled from ``instance`` (fields: instance_id, id_docker, id_s, repo, owner, name,
    base_commit, commit8, version)."""
    instance_id = str(instance["instance_id"])
    owner, _, name = str(instance["repo"]).partition("/")
    values = {
        "instance_id": instance_id,
        "id_docker": instance_id.lower().replace("__", "_1776_"),
        "id_s": instance_id.lower().replace("__", "_s_"),
        "repo": instance["repo"],
        "owner": owner,
        "name": name or owner,
        "base_commit": instance["base_commit"],
        "commit8": str(instance["base_commit"])[:8],
        "version": instance.get("version", ""),
    }
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        raise InvalidRequest(f"image template {template!r}: unknown field {exc}", field="image_template") from None


def _tests(value: Any, instance_id: str, field: str) -> list[str]:
    if isinstance(value, str):  # the Hugging Face exports keep these lists as JSON strings
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidRequest(f"instance {instance_id}: {field} is not a JSON list", field=field) from None
    if not isinstance(value, list) or not all(isinstance(test, str) for test in value):
        raise InvalidRequest(f"instance {instance_id}: {field} must be a list of test names", field=field)
    return value


@dataclass(frozen=True)
class SWEbenchInstance:
    instance_id: str
    raw: dict[str, Any]
    image: str
    grading: SWEbenchConfig

    @property
    def task_id(self) -> str:
        return self.instance_id

    def request(
        self,
        harness: dict[str, Any],
        *,
        samples: int = 1,
        policies: list[dict[str, Any]] | None = None,
        prepare: list[dict[str, Any]] | None = None,
        name_suffix: str = "",
        agent_timeout_s: float = 1800.0,
        eval_timeout_s: float = 1800.0,
    ) -> dict[str, Any]:
        instruction = (
            f"{self.raw['problem_statement'].strip()}\n\n"
            f"The repository {self.raw['repo']} is checked out in the current folder. Change its source so the "
            "issue above is resolved; do not change its tests."
        )
        request: dict[str, Any] = {
            "name": f"{self.instance_id}{name_suffix}"[:128],
            "instruction": instruction,
            "harness": harness,
            "runtime": {
                "type": "docker",
                "options": {"image": self.image, "seed_workdir": True, "network": "none"},
                "prepare": prepare or [],
            },
            "evaluator": {"type": "swebench", "timeout_s": eval_timeout_s, "config": self.grading.model_dump()},
            "num_samples": samples,
            "agent_timeout_s": agent_timeout_s,
            "timeout_s": agent_timeout_s + 300.0,
            "metadata": {
                "source": "swebench",
                "task_id": self.instance_id,
                "swebench": {
                    key: self.raw[key]
                    for key in ("instance_id", "repo", "base_commit", "version", "created_at")
                    if key in self.raw
                },
            },
        }
        if policies:
            request["policies"] = policies
        return request

    def oracle_request(self) -> dict[str, Any]:
        """The instance solved by its gold patch."""
        prepare = [{"type": "write_file", "path": f"../{ORACLE_PATCH}", "content": self.raw["patch"]}]
        command = f"git apply {{workdir}}/../{ORACLE_PATCH}"
        return self.request(
            {"name": "command", "config": {"command": command, "model_calls": "none"}},
            prepare=prepare,
            name_suffix=":oracle",
        )

    def noop_request(self) -> dict[str, Any]:
        return self.request(
            {"name": "command", "config": {"command": "true", "model_calls": "none"}}, name_suffix=":noop"
        )


def read_instance(raw: Any, *, template: str | None = None, dataset: str = "swebench") -> SWEbenchInstance:
    """One instance, checked; ``InvalidRequest`` names the instance and the field."""
    if not isinstance(raw, dict):
        raise InvalidRequest("an instance must be a JSON object", field="instance")
    instance_id = str(raw.get("instance_id") or "?")
    for key in REQUIRED:
        if not raw.get(key):
            raise InvalidRequest(f"instance {instance_id}: {key} is missing or empty", field=key)
    for key in ("eval_script", "log_parser"):
        if not raw.get(key):
            raise InvalidRequest(
                f"instance {instance_id}: {key} is missing (SWE-bench 5 instances carry it; the official grading "
                "needs it)",
                field=key,
            )
    fail_to_pass = _tests(raw["FAIL_TO_PASS"], instance_id, "FAIL_TO_PASS")
    pass_to_pass = _tests(raw.get("PASS_TO_PASS") or [], instance_id, "PASS_TO_PASS")
    if template is None and dataset not in IMAGE_TEMPLATES:
        raise InvalidRequest(f"unknown dataset {dataset!r}; known: {sorted(IMAGE_TEMPLATES)}", field="dataset")
    image = raw.get("image") if template is None and raw.get("image") else None
    image = image or image_name(raw, template or IMAGE_TEMPLATES[dataset])
    try:
        grading = SWEbenchConfig(
            instance_id=instance_id,
            repo=raw["repo"],
            version=str(raw.get("version") or ""),
            base_commit=raw["base_commit"],
            image=image,
            test_patch=raw["test_patch"],
            eval_script=raw["eval_script"],
            FAIL_TO_PASS=fail_to_pass,
            PASS_TO_PASS=pass_to_pass,
            log_parser=raw["log_parser"],
            eval_type=raw.get("eval_type") or "pass_and_fail",
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise InvalidRequest(f"instance {instance_id}: {field}: {first['msg']}", field=field) from None
    if grading.eval_type not in ("pass_and_fail", "fail_only"):
        raise InvalidRequest(f"instance {instance_id}: unknown eval_type {grading.eval_type!r}", field="eval_type")
    return SWEbenchInstance(instance_id, raw, image, grading)


def load_swebench(
    path: Path | str, *, template: str | None = None, dataset: str = "swebench", repos: Path | str | None = None
) -> list[SWEbenchInstance]:
    """Every instance of a JSONL file, all checked before any is returned; with ``repos`` (local clones, see
    ``polar.tasks.patches``) each instance's test patch and gold patch must also apply at its base commit."""
    path = Path(path)
    if not path.is_file():
        raise InvalidRequest(f"{path}: no such file", field="path")
    instances: list[SWEbenchInstance] = []
    seen: set[str] = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except ValueError as exc:
            raise InvalidRequest(f"{path}:{number}: not JSON: {exc}", field="line") from None
        instance = read_instance(raw, template=template, dataset=dataset)
        if instance.instance_id in seen:
            raise InvalidRequest(f"instance {instance.instance_id}: appears twice in {path}", field="instance_id")
        seen.add(instance.instance_id)
        if repos is not None:
            check_patches(instance.raw, Path(repos))
        instances.append(instance)
    if not instances:
        raise InvalidRequest(f"{path}: no instances", field="path")
    return instances
