"""Fixtures for the runtime tests: a Docker engine (``scripts/docker_env.sh start``) and its base image, the tools
folder (agent CLIs and Node, ``POLAR_TOOLS`` or the repository's ``.polar-tools``), a rollout context whose
runtimes live under this module's folder, and a check that no test leaves a container behind.

Without an engine or image the Docker tests skip with the reason, except under ``CI=true``, where a missing
engine is a failure: CI starts one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.rollout import RolloutContext
from polar.runtime.docker_engine import LABEL, docker_available, docker_client
from tests.rollout.conftest import sqlite_gateway, sqlite_url  # noqa: F401
from tests.rollout.helpers import test_settings

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("POLAR_DOCKER_IMAGE", "polar/base:bookworm")


def tools_dir() -> Path:
    return Path(os.environ.get("POLAR_TOOLS") or REPO / ".polar-tools")


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI starts one: scripts/docker_env.sh start)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_engine() -> object:
    reason = docker_available()
    if reason:
        _unavailable(reason)
    client = docker_client()
    if not client.images.list(name=IMAGE):
        _unavailable(f"the image {IMAGE} is not built (scripts/docker_env.sh start)")
    return client


@pytest.fixture
def no_leaks(docker_engine, tmp_path: Path) -> Iterator[Path]:
    """A runtime root for the test; afterwards no container of a runtime under it may exist."""
    yield tmp_path
    left = [
        c.name
        for c in docker_engine.containers.list(all=True, filters={"label": LABEL})
        if Path(c.labels.get("polar.root", "/")).is_relative_to(tmp_path)
    ]
    for name in left:
        docker_engine.containers.get(name).remove(force=True)
    assert not left, f"containers left behind: {left}"


@pytest.fixture(scope="module")
def docker_context(tmp_path_factory, cache_dir, sqlite_url, sqlite_gateway) -> Iterator[RolloutContext]:
    """A rollout context on the module's SQLite store and gateway, with docker runtimes by default."""
    settings = test_settings(
        tmp_path_factory.mktemp("home"),
        cache_dir,
        sqlite_url,
        runtime="docker",
        copy_roots=str(tmp_path_factory.getbasetemp()),  # the copy test's host files
        tools=tools_dir(),
        docker_image=IMAGE,
        init_retries=0,
        run_retries=0,
        postrun_retries=0,
        evaluate_retries=0,
    )
    ctx = RolloutContext.create(settings, gateway_url=sqlite_gateway.url)
    yield ctx
    ctx.close()
