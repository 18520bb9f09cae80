"""The base of the control API's response bodies."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Reply(BaseModel):
    """A JSON response body. A key the routes' read models produce but the reply does not declare is an error
    (a 500 the tests see), never a key silently dropped from what clients get; field order is key order."""

    model_config = ConfigDict(extra="forbid")
