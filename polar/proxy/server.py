"""``polar gateway``: run the gateway with uvicorn on the configured backend and store."""

from __future__ import annotations

import uvicorn

from db.engine import describe_database, normalize_url
from polar.auth import where
from polar.proxy.app import create_app
from polar.proxy.gateway import Gateway
from polar.proxy.registration import registered
from polar.settings import Settings


async def serve_gateway(settings: Settings, host: str, port: int) -> None:
    gateway = await Gateway.create(settings)
    config = uvicorn.Config(create_app(gateway), host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
    print(
        f"polar gateway on http://{host}:{port} (backend={gateway.backend.name}, "
        f"store: {describe_database(normalize_url(settings.resolved_database_url))}); "
        f"control routes need the token from {where(settings)}",
        flush=True,
    )
    async with registered(gateway.factory, settings, host, port):  # the control API pushes weights to it
        await uvicorn.Server(config).serve()
