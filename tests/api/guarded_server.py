"""``python -m tests.api.guarded_server PORT``: the control API as ``polar serve`` serves it (``api_config``: its
uvicorn settings, the header timeout included) on 127.0.0.1:PORT, over the store and settings of the POLAR_*
environment, in a process of its own so a test can measure that process's memory and freeze its store. Tasks are
accepted but never run (the rollout flows are not what these tests look at)."""

from __future__ import annotations

import sys

import uvicorn

from polar.api import create_api
from polar.api.server import api_config
from polar.rollout.context import store_factory
from polar.settings import Settings


async def _never_run(rollout_ids: list[str], settings: Settings, dispatcher: str) -> None:
    return None


def main(port: int) -> None:
    settings = Settings()
    app = create_api(settings, store_factory(settings), run_inline=_never_run)  # the store as polar serve opens it
    uvicorn.Server(api_config(app, settings, host="127.0.0.1", port=port)).run()


if __name__ == "__main__":
    main(int(sys.argv[1]))
