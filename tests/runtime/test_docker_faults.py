"""Runtime faults through the rollout pipeline, in real containers: a container that dies mid-run, a prepare
command past its timeout, an image that does not exist, a full disk on upload. Each ends the rollout ERROR
with a message that says what happened, and no container is left. And a harness in a container reaches
nothing but its own gateway session."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from db.enums import RolloutStatus
from polar.rollout import drive_rollout, process_limiter, submit_tasks
from polar.runtime.docker_engine import docker_client
from tests.rollout.helpers import GIT_INIT, answer_task, captures, rollout_row, trajectories
from tests.runtime.conftest import tools_dir


def command_task(command: str, *, prepare: list | None = None, options: dict | None = None, **extra) -> dict:
    return answer_task(
        samples=1,
        policies=None,
        harness={"name": "command", "config": {"command": command}},
        runtime={
            "type": "docker",
            "prepare": prepare if prepare is not None else [{"command": GIT_INIT}],
            "options": options or {},
        },
        **extra,
    )


async def drive(ctx, task: dict, root: Path):
    ctx.settings.runtime_root = root  # this test's folder: the leak check looks there
    (submitted,) = submit_tasks(ctx.factory, [task])
    (rollout_id,) = submitted.rollout_ids
    try:
        await drive_rollout(ctx, rollout_id, f"test-{rollout_id}", limiter=process_limiter(ctx.settings))
    except Exception as exc:  # noqa: BLE001 - a failed stage re-raises after marking the rollout
        error = exc
    else:
        error = None
    return rollout_row(ctx.factory, rollout_id), error


def stage_error(row) -> str:
    return row.error or json.dumps(row.stage_results)


async def test_a_container_that_dies_mid_run_ends_the_rollout_error(docker_context, no_leaks):
    ctx = docker_context
    task = command_task("echo started > started.txt; sleep 120")

    async def kill_when_started() -> None:
        while not list(no_leaks.glob("*/work/started.txt")):
            await asyncio.sleep(0.1)
        (marker,) = no_leaks.glob("*/work/started.txt")
        docker_client().containers.get(f"polar-{marker.parents[1].name}").kill()

    killer = asyncio.create_task(kill_when_started())
    row, _ = await drive(ctx, task, no_leaks)
    killed = killer.done()
    killer.cancel()
    assert killed, f"the harness never started: {stage_error(row)}"
    assert row.status is RolloutStatus.ERROR and row.reward == 0.0
    run = row.stage_results["run"]
    assert run["outcome"] == "ERROR" and "stopped while the command ran" in run["error"]


async def test_an_exec_past_its_timeout_ends_the_rollout_error(docker_context, no_leaks):
    prepare = [{"command": GIT_INIT}, {"command": "sleep 100", "timeout_s": 1}]
    row, error = await drive(docker_context, command_task("true", prepare=prepare), no_leaks)
    assert row.status is RolloutStatus.ERROR and error is not None
    assert "prepare action 1 ('sleep 100') failed 1 time(s); last: timed out after 1 s" in stage_error(row)


async def test_a_missing_image_ends_the_rollout_error(docker_context, no_leaks):
    row, _ = await drive(docker_context, command_task("true", options={"image": "polar/absent:0"}), no_leaks)
    assert row.status is RolloutStatus.ERROR
    assert "image 'polar/absent:0' is not on this Docker engine" in stage_error(row)


@pytest.fixture
def small_disk(no_leaks: Path):
    """The runtime root on an 8 MiB tmpfs: uploads beyond it hit a real ENOSPC."""
    mount = no_leaks / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_full_disk_on_upload_ends_the_rollout_error(docker_context, no_leaks, small_disk, tmp_path_factory):
    big = tmp_path_factory.mktemp("data") / "big.bin"
    big.write_bytes(b"\0" * (16 * 2**20))
    prepare = [{"command": GIT_INIT}, {"type": "copy", "source": str(big), "path": "data/big.bin"}]
    row, _ = await drive(docker_context, command_task("true", prepare=prepare), small_disk)
    assert row.status is RolloutStatus.ERROR
    assert "No space left on device" in stage_error(row) and "prepare action 1" in stage_error(row)


PROBE = r"""
const [gateway, hostPort] = process.argv.slice(2);
const key = process.env.OPENAI_API_KEY;
const get = (url, headers) => fetch(url, {headers}).then(r => r.status, e => 'ERR ' + (e.cause?.code || e));
(async () => {
  const out = {};
  const chat = await fetch(gateway + '/v1/chat/completions', {method: 'POST',
    headers: {authorization: 'Bearer ' + key, 'content-type': 'application/json'},
    body: JSON.stringify({model: 'polar', max_tokens: 2, messages: [{role: 'user', content: 'hi'}]})});
  out.own_session = chat.status;
  out.other_session = await get(gateway + '/v1/sessions/not-mine/captures', {authorization: 'Bearer ' + key});
  out.host_service = await get('http://127.0.0.1:' + hostPort + '/');
  out.outside = await get('http://deb.debian.org/');
  console.log(JSON.stringify(out));
})();
"""


async def test_a_harness_in_docker_reaches_only_its_gateway_session(docker_context, no_leaks, sqlite_gateway):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    host_port = listener.getsockname()[1]
    node = tools_dir() / "node" / "bin" / "node"
    command = f'{node} probe.js "${{OPENAI_BASE_URL%/v1}}" {host_port}'
    prepare = [{"command": GIT_INIT}, {"type": "write_file", "path": "probe.js", "content": PROBE}]
    task = command_task(command, prepare=prepare, evaluator={"type": "command", "config": {"command": "true"}})
    try:
        row, _ = await drive(docker_context, task, no_leaks)
    finally:
        listener.close()
    assert row.status is RolloutStatus.COMPLETED, stage_error(row)
    probe = json.loads(row.stage_results["run"]["stdout_tail"])
    assert probe["own_session"] == 200
    assert probe["other_session"] in (401, 403, 404)
    assert str(probe["host_service"]).startswith("ERR") and str(probe["outside"]).startswith("ERR")
    assert len(captures(docker_context.factory, row.id)) == 1 and trajectories(docker_context.factory, row.id)
