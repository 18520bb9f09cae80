"""One harness run, meant to execute inside a fresh network namespace (``unshare -n``):

    unshare -n -- bash -c 'ip link set lo up && exec .venv/bin/python -m tests.e2e.runner --harness pi --run-dir D'

It starts a gateway on 127.0.0.1 (SQLite store in the run dir, the local ``tiny-long`` model, whose
64k-position range fits the CLIs' 6k-40k-token prompts), creates a session with the harness's scripted
policy, writes the harness's config files into a fresh HOME, runs the CLI headless with a timeout, and
writes ``result.json``. The CLI's stdout/stderr and the gateway log are files in the run dir.

``--model-path DIR`` (a folder made by ``polar model init``, any chat-format family): the model is served by
``polar serve-model --model-path DIR`` inside the namespace and the gateway takes its tokenizer and chat format
from DIR, as a user's set-up with a real model does (no toy setting).
Assertions are the outer test's job (tests/e2e/test_harnesses.py); this only runs and records.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from harness_adapters.npm_cli import fill, render
from tests.e2e.dnslog import DnsLogger
from tests.e2e.harness_spec import COMMON_ENV, Harness, placeholders, tools_dir
from tests.e2e.harnesses import HARNESSES, OTHER_RUNS
from tests.e2e.multiagent import SCENARIOS

MODEL = "tiny-long"


def write_configs(harness: Harness, values: dict[str, str], home: Path) -> list[str]:
    written = []
    for rel, (fmt, template) in harness.files.items():
        path = home / fill(rel, values)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = fill(template, values)
        path.write_text(render(fmt, data))  # the adapters' serialisers (json, tomli_w)
        written.append(str(path))
    return written


def harness_env(harness: Harness, values: dict[str, str], home: Path, tmp: Path) -> dict[str, str]:
    """A clean environment: nothing from the caller's (no stray API keys or proxies) but PATH basics."""
    # The tools folder's Node (polar harness install node: the version the pinned CLIs need) before the host's.
    tools_node = tools_dir() / "node" / "bin" / "node"
    node = str(tools_node) if tools_node.is_file() else shutil.which("node")
    path = (
        [str(harness.executable.parent)]
        + ([os.path.dirname(node)] if node else [])
        + ["/usr/local/bin", "/usr/bin", "/bin"]
    )
    env = {
        "PATH": os.pathsep.join(dict.fromkeys(path)),
        "HOME": str(home),
        "USER": os.environ.get("USER", "root"),
        "LANG": "C.UTF-8",
        "TMPDIR": str(tmp),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local/state"),
        **COMMON_ENV,
    }
    env.update(fill(harness.env, values))
    return env


def run_cli(harness: Harness, argv: list[str], env: dict[str, str], cwd: Path, run_dir: Path, timeout: float) -> dict:
    started = time.monotonic()
    with open(run_dir / "cli.stdout", "wb") as out, open(run_dir / "cli.stderr", "wb") as err:
        proc = subprocess.Popen(
            [str(harness.executable), *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        timed_out = False
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
    # Background children the CLI left behind (its process group) end with the run.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return {"exit_code": code, "timed_out": timed_out, "cli_s": round(time.monotonic() - started, 2)}


def probe_dns(dns: DnsLogger) -> bool:
    """Resolve a name through the system resolver: True when the logger saw it (the logging is real)."""
    import socket

    probe = "polar-dns-probe.invalid"
    try:
        socket.getaddrinfo(probe, 80)
    except OSError:
        pass
    seen = probe in dns.names
    dns.names[:] = [n for n in dns.names if n != probe]
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", required=True, choices=sorted(HARNESSES | SCENARIOS | OTHER_RUNS))
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--cache", required=True, type=Path, help="POLAR_CACHE: built tokenizers and models")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("POLAR_E2E_THREADS", "2")))
    parser.add_argument("--dns-log", action="store_true", help="serve DNS on 127.0.0.1:53 and log the names asked for")
    parser.add_argument("--model-path", type=Path, help="serve this model folder with polar serve-model")
    parser.add_argument(
        "--lb-idle", type=float, help="put HAProxy cutting connections idle this long in front of the gateway"
    )
    parser.add_argument("--reply-delay", type=float, default=0.0, help="the scripted policy holds each reply this long")
    args = parser.parse_args(argv)

    t0 = time.monotonic()
    harness = {**HARNESSES, **SCENARIOS, **OTHER_RUNS}[args.harness]
    run_dir = args.run_dir.resolve()
    home, work, tmp, gwdir = (run_dir / n for n in ("home", "work", "tmp", "gateway"))
    for d in (home, work, tmp, gwdir):
        d.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=run_dir / "gateway.log", level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )

    result: dict = {"harness": harness.name, "version": harness.version, "t0": t0}
    result["ip_link"] = subprocess.run(["ip", "-o", "link"], check=False, capture_output=True, text=True).stdout

    from polar.backends.local import LocalBackend
    from tests.proxy.gateway_server import settings_for

    dns = DnsLogger() if args.dns_log else nullcontext()
    served = ServedModel(args.model_path, run_dir, args.cache, args.threads) if args.model_path else nullcontext()
    with served as model_url:
        if model_url:
            settings = settings_for(
                gwdir,
                args.cache,
                model_path=args.model_path,
                backend="sglang",
                backend_url=model_url,
                torch_threads=args.threads,
            )
            backend = None
        else:
            settings = settings_for(gwdir, args.cache, model=MODEL, torch_threads=args.threads)
            backend = LocalBackend.from_spec(MODEL, args.cache, threads=args.threads)
        if args.lb_idle:  # the gateway keeps silent calls alive well within the load balancer's idle timeout
            settings = settings.model_copy(update={"keepalive_s": args.lb_idle / 4})
        run_harness(args, harness, settings, backend, dns, result, (home, work, tmp, run_dir))
    result["dns_lookups"] = dns.names if args.dns_log else None
    result["total_s"] = round(time.monotonic() - result.pop("t0"), 2)
    (run_dir / "result.json").write_text(json.dumps(result, indent=2))
    return 0


class ServedModel:
    """``polar serve-model --model-path`` in a subprocess (its log in the run dir); the context is its URL."""

    def __init__(self, folder: Path, run_dir: Path, cache: Path, threads: int):
        self.folder, self.run_dir, self.cache, self.threads = folder, run_dir, cache, threads
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> str:
        import httpx

        from tests.proxy.gateway_server import free_port

        port = free_port()
        argv = ["serve-model", "--model-path", str(self.folder), "--port", str(port), "--threads", str(self.threads)]
        with open(self.run_dir / "serve-model.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "polar.cli", *argv, "--cache-dir", str(self.cache), "--log-level", "warning"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"polar serve-model did not start; see {self.run_dir / 'serve-model.log'}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_harness(args, harness: Harness, settings, backend, dns, result: dict, dirs: tuple[Path, ...]) -> None:
    from tests.e2e.gateway import LoggingGatewayServer

    home, work, tmp, run_dir = dirs
    server = LoggingGatewayServer(settings, backend)
    server.start_timeout_s = 240.0 if settings.model_path else server.start_timeout_s
    with dns, server, _load_balancer(server, args.lb_idle, run_dir) as url:
        if args.dns_log:
            result["dns_probe_logged"] = probe_dns(dns)
        values = placeholders(home=home, workdir=work, gateway=url, key="", model=harness.model)
        policy = fill(harness.policy(), values)
        session = server.session({**policy, "delay_s": args.reply_delay} if args.reply_delay else policy)
        values["key"] = session["api_key"]
        result.update(
            session_id=session["session_id"],
            database_url=settings.resolved_database_url,
            gateway=server.url,
            workdir=str(work),
            config_files=write_configs(harness, values, home),
            startup_s=round(time.monotonic() - result["t0"], 2),
        )
        env = harness_env(harness, values, home, tmp)
        result["context_length"] = session.get("context_length")
        if harness.context_env and result["context_length"]:  # as the adapter does (CliSpec.context_env)
            env[harness.context_env] = str(result["context_length"])
        argv_filled = fill(harness.argv, values)
        result["argv"] = argv_filled
        result.update(run_cli(harness, argv_filled, env, work, run_dir, args.timeout))


@contextmanager
def _load_balancer(server, idle_s: float | None, run_dir: Path) -> Iterator[str]:
    """The URL the CLI is given: the gateway's own, or HAProxy's in front of it."""
    if not idle_s:
        yield server.url
        return
    from tests.haproxy import HAProxy

    with HAProxy(server.url.removeprefix("http://"), idle_s=idle_s, workdir=run_dir) as lb:
        yield lb.url


if __name__ == "__main__":
    sys.exit(main())
