from tests.rollout.conftest import context, sqlite_gateway, sqlite_url  # noqa: F401
