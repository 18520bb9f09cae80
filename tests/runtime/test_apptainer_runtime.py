"""The apptainer runtime, where Apptainer exists: exec with exit code and environment, a timeout that kills the
command, a network holding only ``lo`` whose one way out is ``reach``'s tunnel, and stop.

Apptainer is not packaged for Debian 12 (this machine), so these tests skip here. To run them elsewhere: install
Apptainer (>= 1.2, with network namespaces allowed for the user, e.g. as root), make an image of the base root,
for example ``apptainer build polar-base.sif docker-daemon://polar/base:bookworm`` after
``scripts/docker_env.sh start``, run ``polar harness install node`` into the tools folder, then
``POLAR_TEST_APPTAINER_IMAGE=$PWD/polar-base.sif .venv/bin/python -m pytest tests/runtime/test_apptainer_runtime.py``.
"""

from __future__ import annotations

import http.server
import os
import threading

import pytest

from polar.runtime.apptainer import ApptainerOptions, ApptainerRuntime, apptainer_available
from tests.runtime.conftest import tools_dir

IMAGE = os.environ.get("POLAR_TEST_APPTAINER_IMAGE", "")

pytestmark = [
    pytest.mark.skipif(apptainer_available() is not None, reason=str(apptainer_available())),
    pytest.mark.skipif(not IMAGE, reason="POLAR_TEST_APPTAINER_IMAGE names no image (a SIF file or sandbox folder)"),
]


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args) -> None:
        pass


async def test_exec_timeout_network_and_tunnel(tmp_path):
    rt = ApptainerRuntime(
        "app", tmp_path, image=IMAGE, tools_dir=tools_dir(), options=ApptainerOptions(), env={"FROM_TASK": "t"}
    )
    await rt.start(fresh=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = await rt.exec("echo $FROM_TASK; pwd; exit 3")
        assert result.returncode == 3 and result.stdout.split() == ["t", str(rt.layout.work)]
        assert (await rt.exec("sleep 100", timeout_s=1)).timed_out
        assert "eth" not in (await rt.exec("cat /proc/net/dev")).stdout
        node = tools_dir() / "node" / "bin" / "node"
        fetch = "fetch(process.argv[1]).then(r => r.text()).then(console.log, e => console.log('ERR'))"
        url = f"http://127.0.0.1:{server.server_port}"
        async with rt.reach(url) as inner:
            assert (await rt.exec([str(node), "-e", fetch, inner], timeout_s=30)).stdout.strip() == "hello"
    finally:
        server.shutdown()
        await rt.stop(remove=True)
