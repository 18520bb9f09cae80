"""Task images built from a build context (a Harbor task's ``environment/``) on the Docker engine.

- The tag is the context's content hash (``polar-task/<name>:<sha256 of every file's path, mode and bytes>``), so
  an unchanged context is built once and every rollout of it reuses the image; a changed file is a new tag.
- Images are never pulled: each ``FROM`` image must already be on the engine (stage names and ``scratch``
  excepted), else a ``SandboxError`` names the missing image before the build starts (``pull=False``).
- Builds run without a network unless the spec's ``network`` (or ``POLAR_DOCKER_BUILD_NETWORK``) is ``host``:
  then ``RUN`` steps reach what the host reaches (package registries, and also the host's loopback services, so
  only for task folders you trust). The network is not part of the tag: an image is the same whichever built it.
- The build's log is kept next to the image's lock (``<logs>/<tag>.log``) whether it succeeds or not, and a
  failed build's error quotes its last lines.
- ``timeout_s`` bounds the whole build (Harbor's ``build_timeout_sec``); a build past it is abandoned (its
  connection closed, which stops the engine's legacy builder) and is a ``SandboxError``.
- Builds of one tag in one process take turns (a lock per tag), so a batch of rollouts builds each image once.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from polar.errors import SandboxError


class BuildSpec(BaseModel):
    """``runtime.options.build`` of the docker runtime: an image built from a folder instead of a named one."""

    model_config = ConfigDict(extra="forbid")
    context: str = Field(min_length=1, description="the build context folder on the host (holds the Dockerfile)")
    dockerfile: str = Field(default="Dockerfile", description="relative to the context")
    name: str = Field(default="task", pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$", description="the tag's repository part")
    timeout_s: float = Field(default=600.0, gt=0, description="the whole build's limit (build_timeout_sec)")
    network: Literal["none", "host"] | None = Field(default=None, description="default POLAR_DOCKER_BUILD_NETWORK")


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()
_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE)


def context_digest(context: Path) -> str:
    """sha256 over the context's files (sorted relative paths, executable bits and contents)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file() or p.is_symlink()):
        relative = path.relative_to(context).as_posix()
        digest.update(relative.encode() + b"\0")
        if path.is_symlink():
            digest.update(b"link:" + os.readlink(path).encode() + b"\0")
            continue
        digest.update(b"x" if os.access(path, os.X_OK) else b"-")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def image_tag(spec: BuildSpec) -> str:
    return f"polar-task/{spec.name}:{context_digest(Path(spec.context))[:16]}"


def base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile builds FROM, without its own stage names and ``scratch``."""
    stages: set[str] = set()
    images: list[str] = []
    for line in dockerfile.splitlines():
        match = _FROM.match(line)
        if not match:
            continue
        image, alias = match.group(1), match.group(2)
        if image.lower() != "scratch" and image not in stages and image not in images:
            images.append(image)
        if alias:
            stages.add(alias)
    return images


def check_inside(spec: BuildSpec, roots: Sequence[Path]) -> None:
    """``SandboxError`` unless the build context lies inside one of ``roots`` (``POLAR_COPY_ROOTS``)."""
    context = Path(spec.context).expanduser().resolve()
    if not any(context == Path(r).resolve() or Path(r).resolve() in context.parents for r in roots):
        allowed = ", ".join(str(r) for r in roots) or "none are configured"
        raise SandboxError(
            f"image build context {spec.context!r} is outside the folders tasks may use (POLAR_COPY_ROOTS: {allowed})"
        )


def _lock(tag: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(tag, threading.Lock())


def _check_context(spec: BuildSpec) -> tuple[Path, Path]:
    context = Path(spec.context)
    if not context.is_dir():
        raise SandboxError(f"image build context {spec.context!r} is not a folder")
    dockerfile = context / spec.dockerfile
    if not dockerfile.is_file():
        raise SandboxError(f"image build context {spec.context!r} has no {spec.dockerfile}")
    return context, dockerfile


def has_image(client: Any, name: str) -> bool:
    """Whether the engine has the image ``name`` (never pulled)."""
    import docker

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_image(client: Any, spec: BuildSpec, logs_dir: Path, *, network: str = "none") -> str:
    """The tag of ``spec``'s image, built now (on ``network``) unless the engine has it. Blocking; raises
    ``SandboxError``."""
    context, dockerfile = _check_context(spec)
    tag = image_tag(spec)
    with _lock(tag):
        if has_image(client, tag):
            return tag
        for base in base_images(dockerfile.read_text(errors="replace")):
            if not has_image(client, base):
                raise SandboxError(
                    f"image build of {spec.context}: FROM image {base!r} is not on this Docker engine "
                    "(Polar never pulls images: build or load it first)"
                )
        logs_dir.mkdir(parents=True, exist_ok=True)
        log_path = logs_dir / (tag.replace("/", "_").replace(":", "_") + ".log")
        _build(client, spec, context, tag, log_path, network)
    return tag


def _build(client: Any, spec: BuildSpec, context: Path, tag: str, log_path: Path, network: str) -> None:
    deadline = time.monotonic() + spec.timeout_s
    error: str | None = None
    with log_path.open("w") as log:
        log.write(f"# polar image build: {tag} from {context} (network {network}, timeout {spec.timeout_s:g} s)\n")
        stream = client.api.build(
            path=str(context),
            dockerfile=spec.dockerfile,
            tag=tag,
            rm=True,
            forcerm=True,
            pull=False,
            network_mode=network,
            decode=True,
            timeout=spec.timeout_s,
        )
        try:
            for chunk in stream:
                log.write(str(chunk.get("stream") or chunk.get("status") or ""))
                if "error" in chunk:
                    error = str(chunk.get("error")).strip()
                    log.write(f"\nERROR: {error}\n")
                if time.monotonic() > deadline:
                    error = f"the build ran past its timeout of {spec.timeout_s:g} s"
                    log.write(f"\nERROR: {error}\n")
                    break
        except Exception as exc:  # noqa: BLE001 - a read timeout or a dropped connection: the build failed
            # a step silent past the deadline ends as the client's read timeout: name the limit, not the socket
            late = time.monotonic() >= deadline
            error = f"the build ran past its timeout of {spec.timeout_s:g} s" if late else f"the build stopped: {exc}"
            log.write(f"\nERROR: {error}\n")
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
    if error is not None:
        offline = "" if network == "host" else "a build that downloads needs `polar tasks build --network host`; "
        raise SandboxError(
            f"image build of {context} failed: {error}. The task's image is {tag}: {offline}an image built elsewhere "
            f"is taken with `polar tasks build --adopt IMAGE` (log: {log_path})"
        )
