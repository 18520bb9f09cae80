"""The control API: ``create_api`` (the app's assembly), ``routes`` (one router per resource), ``deps`` (what the
routes depend on), ``schemas`` (request and reply models), ``error_handlers`` (the one error shape), ``runner``
(admission, dispatch, cancel), ``callbacks`` (webhooks), ``weights`` (publishing versions to the gateways),
``queries`` (read models), ``serve`` (``polar serve``)."""

from polar.api.app import create_api
from polar.api.server import serve

__all__ = ["create_api", "serve"]
