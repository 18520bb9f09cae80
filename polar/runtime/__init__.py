"""Runtimes: where a rollout's commands run. ``Runtime`` is the contract (``base``); ``RUNTIMES``
maps a name to a factory and ``open_runtime`` builds one. Built in: ``local`` (a subprocess in a per-rollout
folder with its own ``HOME``, confined with bubblewrap where it works: ``polar.runtime.bwrap``), ``docker`` (a
container per rollout, on the Docker SDK) and ``apptainer`` (an Apptainer instance per rollout, on the
``apptainer`` command line).

A task's ``runtime.options`` are validated against the runtime's ``OPTIONS`` model at submission.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from polar.errors import InvalidRequest, invalid_from
from polar.runtime.apptainer import ApptainerOptions, ApptainerRuntime
from polar.runtime.base import ExecResult, ProcessHandle, Runtime, RuntimeLayout
from polar.runtime.bwrap import bwrap_available, bwrap_problem
from polar.runtime.docker import DockerRuntime
from polar.runtime.docker_engine import DockerOptions
from polar.runtime.local import LocalRuntime
from polar.settings import Isolation, Settings

RuntimeFactory = Callable[[Settings, str, Mapping[str, str], Isolation | None, Any], Runtime]


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _local(settings: Settings, key: str, env: Mapping[str, str], isolation: Isolation | None, options: Any) -> Runtime:
    return LocalRuntime(
        key,
        settings.runtime_dir,
        env=env,
        isolation=isolation or settings.runtime_isolation,
        tools_dir=settings.tools_dir,
    )


def _docker(settings: Settings, key: str, env: Mapping[str, str], isolation: Isolation | None, options: Any) -> Runtime:
    return DockerRuntime(
        key,
        settings.runtime_dir,
        image=settings.docker_image,
        tools_dir=settings.tools_dir,
        options=options,
        env=env,
        docker_host=settings.docker_host,
        network=settings.docker_network,
        build_network=settings.docker_build_network,
        build_roots=settings.copy_root_paths,
        build_logs=settings.home / "image-builds",
    )


def _apptainer(
    settings: Settings, key: str, env: Mapping[str, str], isolation: Isolation | None, options: Any
) -> Runtime:
    return ApptainerRuntime(
        key,
        settings.runtime_dir,
        image=settings.apptainer_image,
        tools_dir=settings.tools_dir,
        options=options,
        env=env,
    )


RUNTIMES: dict[str, RuntimeFactory] = {"local": _local, "docker": _docker, "apptainer": _apptainer}
OPTIONS: dict[str, type[BaseModel]] = {"local": NoOptions, "docker": DockerOptions, "apptainer": ApptainerOptions}


def check_runtime(kind: str, options: Mapping[str, Any] | None = None) -> BaseModel:
    """The runtime's validated options; ``InvalidRequest`` names an unknown runtime or a bad option."""
    if kind not in RUNTIMES:
        raise InvalidRequest(f"unknown runtime {kind!r}; known: {sorted(RUNTIMES)}", field="runtime.type")
    try:
        return OPTIONS[kind].model_validate(dict(options or {}))
    except ValidationError as exc:
        raise invalid_from(exc, "runtime options", prefix="runtime.options") from None


def open_runtime(
    kind: str,
    settings: Settings,
    key: str,
    *,
    env: Mapping[str, str] | None = None,
    isolation: Isolation | None = None,
    options: Mapping[str, Any] | None = None,
) -> Runtime:
    """The runtime ``key`` of kind ``kind`` (not started: call ``start``)."""
    validated = check_runtime(kind, options)
    return RUNTIMES[kind](settings, key, env or {}, isolation, validated)


__all__ = [
    "OPTIONS",
    "RUNTIMES",
    "ApptainerRuntime",
    "DockerRuntime",
    "ExecResult",
    "LocalRuntime",
    "ProcessHandle",
    "Runtime",
    "RuntimeLayout",
    "bwrap_available",
    "bwrap_problem",
    "check_runtime",
    "open_runtime",
]
