"""The docker runtime's file boundary: a container sees its image, its own runtime folder and the tools folder,
and no other host file (a secret beside the runtime folder, the control token in ``POLAR_HOME``)."""

from __future__ import annotations

import shlex
from pathlib import Path

from polar.runtime.docker import DockerRuntime
from polar.runtime.docker_engine import DockerOptions
from tests.runtime.conftest import IMAGE, tools_dir


async def test_a_docker_runtime_sees_no_host_file_outside_its_mounts(no_leaks: Path):
    secret = no_leaks / "secret.txt"
    secret.write_text("host secret\n")
    token = no_leaks / "home" / "control-token"
    token.parent.mkdir()
    token.write_text("polar-ctl-test\n")
    rt = DockerRuntime("boundary", no_leaks / "runtimes", image=IMAGE, tools_dir=tools_dir(), options=DockerOptions())
    await rt.start(fresh=True)
    try:
        reads = "; ".join(
            f"cat {shlex.quote(str(path))} >/dev/null 2>&1 && echo {name}=read"
            for name, path in {"secret": secret, "token": token}.items()
        )
        result = await rt.exec(f"{reads}; echo mine > own.txt && cat own.txt")
        assert result.stdout.split() == ["mine"], result.stdout
        assert (rt.layout.work / "own.txt").read_text() == "mine\n"
    finally:
        await rt.stop(remove=True)
