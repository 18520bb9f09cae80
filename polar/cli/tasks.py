"""``polar tasks import harbor PATH...`` and ``polar tasks import swebench FILE.jsonl`` (TaskRequests as JSON), and
``polar tasks check PATH...`` (each task's oracle and a no-op agent through the pipeline, as ``polar run`` runs a
batch) and ``polar tasks build PATH...`` (each task's image built or adopted, its tag printed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from polar.cli.runs import allow_copy_root, batch, harness_spec
from polar.settings import get_settings

REPOS_HELP = (
    "local clones (a git repository, or a folder of <owner>/<name> or <name> clones): each instance's test patch "
    "and gold patch must apply at its base commit there, or nothing is imported"
)


def _import(args: argparse.Namespace) -> None:
    from polar.rollout.spec import parse_task_request
    from polar.tasks.harbor import load_harbor
    from polar.tasks.swebench import load_swebench

    tasks: list[Any]
    if args.format == "harbor":
        tasks = load_harbor([Path(p) for p in args.paths])
    else:
        tasks = [
            instance
            for path in args.paths
            for instance in load_swebench(path, template=args.image_template, dataset=args.dataset, repos=args.repos)
        ]
    harness = harness_spec(args.harness, args.harness_config, args.model)
    requests = [task.request(harness, samples=args.samples) for task in tasks]
    for request in requests:
        parse_task_request(request)  # the registries agree, or nothing is written
    text = json.dumps(requests if len(requests) != 1 else requests[0], indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print(f"wrote {len(requests)} TaskRequest(s) to {args.out}")
    else:
        print(text)


def _check(args: argparse.Namespace) -> None:
    from polar.rollout.spec import parse_task_request
    from polar.tasks import load_benchmark
    from polar.tasks.check import check_requests, format_verdicts, judge

    tasks = load_benchmark(args.paths, image_template=args.image_template, repos=args.repos)
    for path in args.paths:
        allow_copy_root(Path(path) if Path(path).is_dir() else Path(path).resolve().parent)
    requests = check_requests(tasks)
    for request in requests:
        parse_task_request(request)
    title = f"polar tasks check: {len(tasks)} task(s), oracle and no-op each"
    rows = batch(get_settings(), requests, title)
    if rows is None:  # the lines above say which rollouts did not run here
        raise SystemExit(1)
    verdicts = judge(tasks, rows)
    print()
    print(format_verdicts(verdicts))
    if not all(v.ok for v in verdicts):
        raise SystemExit(1)


def _build(args: argparse.Namespace) -> None:
    from polar.runtime.docker_engine import docker_client
    from polar.tasks import load_benchmark
    from polar.tasks.build import BuildPlan, format_readiness, make_ready

    settings = get_settings()
    tasks = load_benchmark(args.paths, image_template=args.image_template, repos=args.repos)
    plan = BuildPlan(
        logs=settings.home / "image-builds",
        network=args.network,
        default_network=settings.docker_build_network,
        repos=Path(args.repos) if args.repos else None,
        from_image=args.from_image or settings.docker_image,
    )
    rows = make_ready(docker_client(settings.docker_host), tasks, plan, adopt=args.adopt)
    print(format_readiness(rows))
    if not all(row.ok for row in rows):
        raise SystemExit(1)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tasks = sub.add_parser("tasks", help="benchmark tasks: import Harbor folders, check oracles and no-ops")
    actions = tasks.add_subparsers(dest="tasks_command", required=True)
    imp = actions.add_parser("import", help="print (or write) the TaskRequests of benchmark tasks")
    formats = imp.add_subparsers(dest="format", required=True)
    from polar.tasks.swebench import IMAGE_TEMPLATES

    harbor = formats.add_parser("harbor", help="Harbor task folders, or folders of them")
    harbor.add_argument("paths", nargs="+")
    swebench = formats.add_parser("swebench", help="SWE-bench-style instances, one JSON object per line")
    swebench.add_argument("paths", nargs="+", metavar="FILE.jsonl")
    swebench.add_argument(
        "--dataset", default="swebench", choices=sorted(IMAGE_TEMPLATES), help="image naming of instances without one"
    )
    swebench.add_argument("--image-template", help="override: e.g. 'myorg/sweb.{id_docker}:v1'")
    swebench.add_argument("--repos", help=REPOS_HELP)
    for parser in (harbor, swebench):
        parser.add_argument(
            "--harness", default="mini_swe_agent", help="the harness that will run them (default: mini_swe_agent)"
        )
        parser.add_argument("--harness-config", help="the harness's config as JSON")
        parser.add_argument("--model", help="the model name the harness asks for")
        parser.add_argument("--samples", type=int, default=1, help="samples per task (num_samples)")
        parser.add_argument("--out", help="a JSON file for polar run (default: print)")
        parser.set_defaults(func=_import)
    check = actions.add_parser("check", help="run each task's oracle and a no-op; exit 1 if any task is broken")
    check.add_argument("paths", nargs="+", help="Harbor task folders (or folders of them), SWE-bench .jsonl files")
    check.add_argument("--image-template", help="image naming of SWE-bench instances without an image field")
    check.add_argument("--repos", help=REPOS_HELP)
    check.set_defaults(func=_check)
    build = actions.add_parser(
        "build", help="build (or adopt) each task's image on the Docker engine and print its tag; exit 1 on a failure"
    )
    build.add_argument("paths", nargs="+", help="Harbor task folders (or folders of them), SWE-bench .jsonl files")
    build.add_argument(
        "--network",
        choices=("none", "host"),
        help="the build's network (default: the task's, else POLAR_DOCKER_BUILD_NETWORK); host lets RUN download",
    )
    build.add_argument("--adopt", metavar="IMAGE", help="tag this image, built outside Polar, as the one task's image")
    build.add_argument("--image-template", help="image naming of SWE-bench instances without an image field")
    build.add_argument("--repos", help=REPOS_HELP + "; a missing instance image is built from its clone there")
    build.add_argument(
        "--from-image", help="what SWE-bench instance images are built FROM (default POLAR_DOCKER_IMAGE)"
    )
    build.set_defaults(func=_build)
