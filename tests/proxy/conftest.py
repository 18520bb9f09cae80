from __future__ import annotations

import pytest

from polar.backends.local import LocalBackend
from tests.proxy.gateway_server import GatewayServer, settings_for


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, cache_dir, engine):
    """A gateway on SQLite with the session's local engine as its backend (shared by a module's tests)."""
    tmp = tmp_path_factory.mktemp("gateway")
    with GatewayServer(settings_for(tmp, cache_dir), backend=LocalBackend(engine)) as server:
        yield server
