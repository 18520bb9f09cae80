"""The control token: who may drive the gateway's sessions and the control API.

Control routes are closed by default. ``control_token(settings)`` is ``POLAR_CONTROL_TOKEN`` when set; otherwise
the token stored in ``$POLAR_HOME/control-token`` (mode 0600), generated on first use. Every process sharing a
``POLAR_HOME`` (the embedded demo, ``polar run``, ``polar serve`` and its inline flows, ``polar.client``) reads
the same file, so in-process callers never need to be told the token; processes on other machines are given
``POLAR_CONTROL_TOKEN``. The token itself is never logged, only where it is stored.

Comparisons are constant-time (``hmac.compare_digest``), so response timing tells nothing about a guess.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import re
import secrets
from pathlib import Path
from urllib.parse import unquote_plus

from polar.settings import Settings

log = logging.getLogger(__name__)
TOKEN_FILE = "control-token"
_announced: set[Path] = set()


def token_path(settings: Settings) -> Path:
    return settings.home / TOKEN_FILE


def _read(path: Path) -> str:
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"the control token file {path} is empty; delete it to have a new token generated")
    return token


def _create(path: Path) -> str:
    """Write a new token with mode 0600, atomically: when two processes race, both end up with the winner's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    token = "polar-ctl-" + secrets.token_urlsafe(32)
    staging = path.with_name(f".{TOKEN_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        try:
            os.link(staging, path)  # fails if another process created the file first
        except FileExistsError:
            return _read(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()
    log.warning("no POLAR_CONTROL_TOKEN set: generated a control token in %s (mode 0600)", path)
    return token


def control_token(settings: Settings, *, create: bool = True) -> str:
    """The control token in force; ``create=False`` returns "" instead of generating one (clients)."""
    if settings.control_token:
        return settings.control_token
    path = token_path(settings)
    if path.exists():
        return _read(path)
    return _create(path) if create else ""


def announce(settings: Settings) -> str:
    """The token a server enforces, logging once per file where it is (never the token itself)."""
    token = control_token(settings)
    if not settings.control_token:
        path = token_path(settings)
        if path not in _announced:
            _announced.add(path)
            log.info("control routes need the Bearer token stored in %s", path)
    return token


def where(settings: Settings) -> str:
    """Where the control token in force comes from, for a start-up line (never the token itself)."""
    return "POLAR_CONTROL_TOKEN" if settings.control_token else str(token_path(settings))


def bearer(headers: dict[str, str] | None = None, *, token: str) -> dict[str, str]:
    """``headers`` plus ``Authorization: Bearer token``."""
    return {**(headers or {}), "Authorization": f"Bearer {token}"}


def matches(presented: str | None, expected: str) -> bool:
    """Constant-time equality of a presented secret and the expected one (an empty expectation never matches)."""
    if not presented or not expected:
        return False
    return hmac.compare_digest(presented.encode(), expected.encode())


def bearer_of(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header, if that is what it is."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip() or None
    return None


SECRET_PARAMS = frozenset({"key", "api_key", "token"})
"""Query parameters whose values are secrets: Gemini's ``?key=``, and spellings clients use for the same."""
_PARAM = re.compile(r"([?&])([^=&\s]*)=([^&\s]*)")


def _decoded(name: str) -> str:
    """A query parameter's name as servers read it: percent-decoded (``%6Bey`` is ``key``: Starlette's
    ``query_params`` decode it so, and the gateway takes ``?%6Bey=`` as ``?key=``), ``+`` as a space, and here
    also decoded again while that changes it and lower-cased, so no spelling of a secret's name escapes."""
    for _ in range(4):
        once = unquote_plus(name)
        if once == name:
            break
        name = once
    return name.strip().lower()


def redact_url(text: str) -> str:
    """``text`` with the value of every query parameter whose decoded name is in ``SECRET_PARAMS`` replaced
    (``?key=``, ``?KEY=``, ``?%6Bey=``, ``?%74oken=``, ``&api_key=``, ...)."""

    def one(match: re.Match[str]) -> str:
        if _decoded(match.group(2)) in SECRET_PARAMS:
            return f"{match.group(1)}{match.group(2)}=REDACTED"
        return match.group(0)

    return _PARAM.sub(one, text)


class RedactQueryKeys(logging.Filter):
    """Keeps keys sent as query parameters (Gemini's ``?key=``) out of uvicorn's access log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_url(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.msg, str):
            record.msg = redact_url(record.msg)
        return True


def install_access_log_redaction() -> None:
    """Idempotent: add ``RedactQueryKeys`` to uvicorn's access logger."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQueryKeys) for f in access.filters):
        access.addFilter(RedactQueryKeys())
