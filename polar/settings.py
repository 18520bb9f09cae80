"""The one settings object. Every knob is read from ``POLAR_*`` environment variables (or a ``.env`` file).

Defaults are the embedded set-up: a SQLite file under ``POLAR_HOME``, the in-process local model, the
local runtime, append-mode prompts.
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class BackendKind(StrEnum):
    LOCAL = "local"
    SGLANG = "sglang"
    VLLM = "vllm"


class RenderMode(StrEnum):
    APPEND = "append"
    CANONICAL = "canonical"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POLAR_", env_file=".env", extra="ignore")

    home: Path = Field(default_factory=lambda: Path.home() / ".polar", description="data and cache folder")
    database_url: str = Field(default="", description="SQLAlchemy URL; empty means a SQLite file in home")
    cache: Path | None = Field(default=None, description="built tokenizers and models; empty means home/cache")

    backend: BackendKind = BackendKind.LOCAL
    backend_url: str = Field(default="", description="base URL of an sglang or vllm server")
    backend_timeout_s: float = 600.0
    vllm_endpoint: str = Field(default="generate", description="vLLM token-in endpoint: generate or completions")
    model: str = Field(default="tiny", description="local model spec (see polar.models.tiny.MODEL_SPECS)")
    torch_threads: int = 1

    render_mode: RenderMode = RenderMode.APPEND
    tool_format: str = Field(default="hermes", description="tool-call syntax of the chat template")

    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8700
    control_token: str = Field(default="", description="when set, control endpoints need it as a Bearer token")
    default_max_tokens: int = Field(default=2048, description="reply budget when the caller sets none")
    max_body_bytes: int = Field(default=32 * 1024 * 1024, description="larger request bodies get a 413")
    runtime: str = "local"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'polar.db'}"

    @property
    def cache_dir(self) -> Path:
        return self.cache or self.home / "cache"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once. Tests that change the environment call ``cache_clear()``."""
    return Settings()
