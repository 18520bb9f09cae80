"""Every route an ASGI app serves, read from its own router, for the closed-by-default tests of both servers."""

from __future__ import annotations

import re
from typing import Any


def every_route(app: Any) -> list[tuple[str, str]]:
    """(method, concrete path) of every route the app serves, read from its own router (included routers
    flattened): a new route is tested without anyone listing it here."""
    found = []
    for route in app.routes:
        if hasattr(route, "original_router"):  # FastAPI keeps an included router whole (its paths carry the prefix)
            found += every_route(route.original_router)
            continue
        path = re.sub(r"\{[^}:]+(:path)?\}", "x", getattr(route, "path", ""))
        methods = sorted(getattr(route, "methods", None) or {"GET"})
        found += [(method, path) for method in methods if method != "HEAD"]
    return found
