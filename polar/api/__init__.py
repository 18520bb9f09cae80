"""The control API: ``create_api`` (routes), ``runner`` (admission, dispatch, cancel), ``callbacks`` (webhooks),
``weights`` (publishing versions to the gateways), ``queries`` (read models), ``serve`` (``polar serve``)."""

from polar.api.app import create_api
from polar.api.server import serve

__all__ = ["create_api", "serve"]
