"""The one settings object. Every knob is read from ``POLAR_*`` environment variables (or a ``.env`` file).

Defaults are the embedded set-up: a SQLite file under ``POLAR_HOME``, the in-process local model, the
local runtime, append-mode prompts.
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class BackendKind(StrEnum):
    LOCAL = "local"
    SGLANG = "sglang"
    VLLM = "vllm"


class RenderMode(StrEnum):
    APPEND = "append"
    CANONICAL = "canonical"


class Isolation(StrEnum):
    """How the local runtime confines a command: with bubblewrap (``polar.runtime.bwrap``), not at all (host exec), or
    ``auto``: bubblewrap when it works on this machine, else host exec with a logged warning."""

    NONE = "none"
    BWRAP = "bwrap"
    AUTO = "auto"


class LimitScope(StrEnum):
    """Where stage concurrency limits are counted: in each flow process, fleet-wide by the Prefect server, or
    ``auto``: fleet-wide when a Prefect server is configured (``PREFECT_API_URL``), per process otherwise."""

    AUTO = "auto"
    PROCESS = "process"
    PREFECT = "prefect"


class AccessLog(StrEnum):
    """The gateway's access log: none, one ``key=value`` line per model call, or one JSON object per call."""

    OFF = "off"
    TEXT = "text"
    JSON = "json"


class TaskDispatch(StrEnum):
    """How the control API runs a submitted task: as flow runs of the rollout deployment (any worker of the pool
    picks them up), in its own process, or ``auto``: the deployment when a Prefect server is configured."""

    AUTO = "auto"
    INLINE = "inline"
    DEPLOYMENT = "deployment"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POLAR_", env_file=".env", extra="ignore")

    home: Path = Field(default_factory=lambda: Path.home() / ".polar", description="data and cache folder")
    database_url: str = Field(default="", description="SQLAlchemy URL; empty means a SQLite file in home")
    cache: Path | None = Field(default=None, description="built tokenizers and models; empty means home/cache")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="level of the polar command's own log lines (polar.logs)"
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="text lines, or one JSON object per line for log collectors"
    )

    backend: BackendKind = BackendKind.LOCAL
    backend_url: str = Field(
        default="",
        description="base URL of an sglang or vllm server; several (comma-separated) make a fleet",
    )
    backend_timeout_s: float = 600.0
    backend_retry_after_s: float = Field(
        default=10.0, gt=0, description="a fleet server that failed is skipped this long before it is tried again"
    )
    vllm_endpoint: Literal["generate", "completions"] = Field(
        default="generate", description="vLLM token-in endpoint: generate or completions"
    )
    capture_extras: str = Field(
        default="",
        description="extras sessions may capture, checked against the backend at start: top_logprobs=K,routed_experts",
    )
    model: str = Field(default="tiny", description="toy model of the embedded set-up (polar.models.tiny)")
    model_path: Path | None = Field(default=None, description="the model's Hugging Face folder (tokenizer, config)")
    chat_format: str = Field(default="", description="chat-format family; empty: detected from the model folder")
    served_model_name: str = Field(
        default="", description="the model name the gateway lists (/v1/models); empty: the model folder's name"
    )
    torch_threads: int = 1

    # ---- the LLM judge: its own model; unset, it is the policy, but only when that is the embedded local model
    judge_backend: BackendKind | None = Field(default=None, description="the judge's backend kind")
    judge_url: str = Field(default="", description="base URL of the judge's SGLang or vLLM server")
    judge_model_path: Path | None = Field(default=None, description="the judge model's Hugging Face folder")

    render_mode: RenderMode = RenderMode.APPEND
    tool_format: str = Field(
        default="hermes", description="tool-call syntax of the toy ChatML template (benchmarks); models: the family"
    )

    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8700
    control_token: str = Field(
        default="", description="Bearer token of the control routes; empty: the one generated in home/control-token"
    )
    gateway_advertise_url: str = Field(
        default="", description="URL other hosts reach this gateway at (registry); empty: http://host:port"
    )
    gateway_heartbeat_s: float = Field(default=5.0, gt=0, description="how often a gateway refreshes its registration")
    gateway_stale_s: float = Field(default=30.0, gt=0, description="a gateway silent this long gets no weights")
    default_max_tokens: int = Field(default=2048, description="reply budget when the caller sets none")
    max_body_bytes: int = Field(default=32 * 1024 * 1024, description="larger request bodies get a 413")
    max_json_depth: int = Field(default=64, ge=2, description="deeper nesting in a request body gets a 400")
    max_string_chars: int = Field(default=8 * 1024 * 1024, ge=1, description="longer strings in a body get a 400")
    tokenize_child_min_chars: int = Field(
        default=200_000,
        ge=0,
        description="the gateway tokenizes texts of at least this many characters (a cold start's long opening) in "
        "a child process, so their ids never hold its interpreter lock; 0 keeps all tokenizing in the gateway",
    )
    backend_deadline_s: float = Field(
        default=900.0, gt=0, description="a whole generation (streamed or not) past this gets a shaped 504"
    )
    keepalive_s: float = Field(
        default=20.0,
        ge=0,
        description="a call silent this long gets keep-alive bytes (spaces before a JSON body, empty SSE lines in a "
        "stream) so idle-cutting proxies keep it; 0: never",
    )
    connection_idle_s: int = Field(
        default=75,
        ge=1,
        description="how long the gateway keeps an idle client connection open for its next call (HTTP keep-alive); "
        "longer than clients' own pool expiry (httpx 5 s, undici 4 s), so the client, not the gateway, closes it and "
        "no call is sent on a connection the gateway is closing",
    )
    header_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="a connection that has not sent a whole request line and headers this long after it opened (or "
        "after its request began) is closed, on the gateway and on polar serve",
    )
    backend_max_in_flight: int = Field(
        default=512, ge=0, description="calls generating at once on each inference server; 0: no bound"
    )
    backend_queue_timeout_s: float = Field(
        default=30.0, gt=0, description="how long a call waits for an in-flight slot before its overload error"
    )
    store_connect_timeout_s: float = Field(default=10.0, gt=0, description="connecting to the store")
    store_statement_timeout_s: float = Field(
        default=30.0, gt=0, description="one store statement; also how long a call waits for the store"
    )
    health_timeout_s: float = Field(default=2.0, gt=0, description="each check of /health/ready")
    session_cache_ttl_s: float = Field(
        default=2.0,
        ge=0,
        description="how long a gateway trusts a session key it checked before rechecking it in the background; "
        "a closed or re-keyed session is refused at commit regardless, so no reply is ever acknowledged after it",
    )
    runtime: str = Field(default="local", description="default runtime of a task that names none")

    # ---- rollout pipeline ---------------------------------------------------------------------------
    gateway_url: str = Field(default="", description="gateway for rollouts; empty starts one inside the process")
    runtime_root: Path | None = Field(
        default=None, description="per-rollout working folders; empty means home/runtimes"
    )
    runtime_isolation: Isolation = Field(
        default=Isolation.AUTO,
        description="local runtime: bwrap confines each command to its folder, the tools and the system folders; "
        "none runs it on the host (it can read every host file); auto: bwrap where it works, else none with a warning",
    )
    copy_roots: str = Field(
        default="", description="comma-separated host folders a task's copy action may read; empty: none"
    )
    keep_workdirs: bool = Field(default=False, description="keep a finished rollout's working folders")
    rollout_timeout_s: float = Field(default=1800.0, gt=0, description="deadline of init+run when a task sets none")
    postrun_timeout_s: float = Field(default=300.0, gt=0)
    init_concurrency: int = Field(default=4, ge=1, description="rollouts initialising at once")
    run_concurrency: int = Field(default=8, ge=1, description="harnesses running at once")
    postrun_concurrency: int = Field(default=4, ge=1, description="rollouts in postrun at once")
    ready_buffer: int = Field(default=8, ge=1, description="runtimes initialising or initialised, not yet running")
    stage_limits: LimitScope = Field(
        default=LimitScope.AUTO, description="auto: Prefect global concurrency limits when a server is configured"
    )
    limit_lease_s: float = Field(
        default=60.0,
        ge=60,  # the least the Prefect server accepts (prefect/server/api/concurrency_limits_v2.py: ge=60)
        le=86400,
        description="lease of a fleet-wide stage slot, renewed while held; a dead holder's slot is free after it",
    )
    init_retries: int = Field(default=2, ge=0)
    run_retries: int = Field(default=1, ge=0)
    postrun_retries: int = Field(default=2, ge=0)
    evaluate_retries: int = Field(default=2, ge=0)
    stage_retry_delay_s: float = Field(default=1.0, ge=0)
    heartbeat_s: float = Field(default=10.0, gt=0, description="how often a running rollout proves it is alive")
    stale_after_s: float = Field(default=600.0, gt=0, description="an unfinished rollout silent this long is retried")
    # Each in-flight rollout flow is a Prefect flow run; Prefect's SQLite-backed ephemeral server slows down
    # sharply with many concurrent flow-run creations, so the embedded default stays small.
    artifact_url: str = Field(
        default="",
        description="where rollout artifacts go: a shared folder or an fsspec URL; empty: in the store (capped)",
    )
    artifact_max_bytes: int = Field(
        default=16 * 1024 * 1024, ge=0, description="largest artifact kept in the store (POLAR_ARTIFACT_URL: no cap)"
    )
    batch_max_active: int = Field(
        default=8, ge=1, description="rollout flows an inline batch keeps in flight (deployment dispatch: no cap)"
    )
    rollout_deployment: str = Field(default="polar-rollout/rollout", description="deployment a batch dispatches to")
    batch_max_consecutive_errors: int = Field(
        default=0,
        ge=0,
        description="an inline batch stops (its unstarted rollouts cancelled) after this many rollouts in a row "
        "failed a stage for good (infrastructure errors); 0: never",
    )

    # ---- control API and trainer feed ---------------------------------------------------------------
    allow_scripted_policies: bool = Field(
        default=False, description="accept tasks with scripted gateway policies (tests, demos) on the control API"
    )
    api_host: str = "127.0.0.1"
    api_port: int = 8800
    task_dispatch: TaskDispatch = TaskDispatch.AUTO
    max_async_level: int | None = Field(
        default=None, ge=0, description="start a task only when metadata.step <= current version ordinal + this"
    )
    weight_targets: str = Field(
        default="",
        description="extra comma-separated gateway URLs new weights are pushed to, besides the registered ones",
    )
    weight_push_attempts: int = Field(default=3, ge=1, description="tries of a weight push to one gateway")
    claim_lease_s: float = Field(default=300.0, gt=0, description="lease of a trainer's claim before it expires")
    claim_min_samples: int = Field(
        default=1, ge=0, description="a group is claimable when at least this many of its rollouts are not ERROR"
    )
    callback_attempts: int = Field(default=5, ge=1, description="webhook deliveries tried before giving up")
    callback_backoff_s: float = Field(default=1.0, ge=0, description="first delay between webhook attempts (doubles)")
    api_poll_s: float = Field(default=0.25, gt=0, description="how often the API admits tasks and sends callbacks")

    # ---- web UI (polar serve's /ui) and links to it ----------------------------------------------------------
    public_url: str = Field(
        default="", description="where users reach polar serve (its base URL); Prefect artifacts link to /ui there"
    )
    prefect_ui_url: str = Field(default="", description="Prefect UI base URL; the web UI links flow runs there")
    prefect_api_url: str = Field(
        default="",
        validation_alias="PREFECT_API_URL",  # Prefect's own variable, read here so the library never reads os.environ
        description="the Prefect server (Prefect's PREFECT_API_URL, no POLAR_ prefix); empty: Prefect's ephemeral "
        "in-process server",
    )

    # ---- the live view (/ui/live, polar status) and alarms ------------------------------------------------
    gateway_access_log: AccessLog = Field(
        default=AccessLog.OFF, description="one line per model call on the gateway: off, text or json"
    )
    live_window_s: float = Field(
        default=300.0, gt=0, description="the live view's window: throughput, failures and alarms over the last N s"
    )
    alarm_min_groups: int = Field(
        default=3, ge=1, description="alarm when the rewards of at least this many groups are all 0 (or all 1)"
    )
    alarm_empty_patch_share: float = Field(
        default=0.5, ge=0, le=1, description="a rising share of empty patches alarms only once over this share"
    )
    alarm_no_call_share: float = Field(
        default=0.2, ge=0, le=1, description="a rising share of runs without a model call alarms only over this share"
    )
    alarm_rising_recent: int = Field(
        default=8, ge=1, description="the rising-share alarms compare the last N rollouts (by finish) with those before"
    )
    alarm_rising_factor: float = Field(
        default=2.0, ge=1, description="a share is rising when its recent value is at least this times the earlier one"
    )
    alarm_rising_min_count: int = Field(
        default=2, ge=1, description="a rising-share alarm needs at least this many recent rollouts that show it"
    )
    alarm_infra_error_share: float = Field(
        default=0.1, ge=0, le=1, description="alarm when more than this share of rollouts failed outside the agent"
    )
    fleet_webhook_url: str = Field(
        default="",
        description="fleet alarms (a gateway silent past its heartbeat: no batch, no task) are POSTed here once each",
    )
    alarm_min_rollouts: int = Field(default=4, ge=1, description="the share alarms need at least this many rollouts")

    # ---- runtimes and harness tools (docker, apptainer; polar harness install) ---------------------------
    tools: Path | None = Field(
        default=None, description="agent CLIs and Node (polar harness install); empty means home/tools"
    )
    docker_host: str = Field(default="", description="Docker engine URL; empty means DOCKER_HOST or the default socket")
    docker_image: str = Field(default="polar/base:bookworm", description="image of docker runtimes that name none")
    docker_network: Literal["none", "host"] = Field(
        default="none", description="none (a tunnel to the gateway only) or host"
    )
    docker_build_network: Literal["none", "host"] = Field(
        default="none", description="network of task image builds that name none (host: RUN steps may download)"
    )
    verify_network: Literal["same", "none", "host"] = Field(
        default="same", description="the network evaluators run on: same (the agent's), none or host"
    )
    apptainer_image: str = Field(default="", description="SIF image or sandbox folder of apptainer runtimes")

    @property
    def tools_dir(self) -> Path:
        return self.tools or self.home / "tools"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'polar.db'}"

    @property
    def cache_dir(self) -> Path:
        return self.cache or self.home / "cache"

    @property
    def copy_root_paths(self) -> list[Path]:
        return [Path(p.strip()).expanduser() for p in self.copy_roots.split(",") if p.strip()]

    @property
    def runtime_dir(self) -> Path:
        return self.runtime_root or self.home / "runtimes"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once. Tests that change the environment call ``cache_clear()``."""
    return Settings()
