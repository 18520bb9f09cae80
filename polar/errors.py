"""One exception hierarchy for the whole library.

Each server maps these to its own protocol in one place (a status code and an error type); the classes
carry what that mapping needs. Messages name the offending field or value.

    PolarError
    ├── InvalidRequest (400) ── UnknownSamplingParameter, ContextLengthExceeded, TemplateError, PayloadTooLarge (413)
    ├── AuthenticationError (401), PermissionDenied (403), NotFound (404), ClientClosed (499)
    ├── Conflict (409) ── RolloutClaimed, StageOrderError, TokenizerMismatch;  ArtifactMissing (409)
    ├── BackendError (502) ── BackendUnavailable (503) ── BackendTimeout (504)
    │                     ── Overloaded (429), BackendProtocolError, GenerationAborted
    ├── StoreError (503), NotConfigured (503), ConfigError (at start), GatewayError (502) ── PartialPush
    ├── SandboxError ── PrepareFailed;  HarnessError;  EvaluationError   (rollout pipeline failures)
    ├── GroupFailed   (a trainer adapter's group in which every sample failed)
    └── BatchStopped   (a batch's circuit breaker tripped)

In the rollout pipeline a raised error means "this stage failed; retry it". What a harness did (crashed, ran
out of budget) is an outcome recorded on the rollout, never an exception.
"""

from __future__ import annotations

from pydantic import ValidationError


class PolarError(Exception):
    """Base of every error Polar raises on purpose."""

    status_code: int = 500
    error_type: str = "internal_error"

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidRequest(PolarError):
    """The caller sent something malformed: a wrong type, a missing field, an unknown parameter."""

    status_code = 400
    error_type = "invalid_request_error"


def invalid_from(exc: ValidationError, what: str = "request", *, prefix: str = "") -> InvalidRequest:
    """A pydantic ``ValidationError`` as an ``InvalidRequest`` naming its first bad field.

    ``prefix`` is where the validated object sits in the caller's input (``harness.config``), so the field is
    named as the caller wrote it; a bad top-level value is named ``what``.
    """
    first = exc.errors()[0]
    field = ".".join(str(part) for part in (*([prefix] if prefix else []), *first["loc"])) or what
    message = str(first["msg"]).removeprefix("Value error, ")
    return InvalidRequest(f"invalid {what} at {field}: {message}", field=field)


class UnknownSamplingParameter(InvalidRequest):
    """A sampling parameter the backend does not know (SGLang rejects these with 400 as well)."""


class ContextLengthExceeded(InvalidRequest):
    """The prompt (plus what must be generated) does not fit the model's context window."""

    error_type = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, context_length: int):
        super().__init__(
            f"prompt has {prompt_tokens} tokens but the model's context window is {context_length} tokens",
            field="prompt",
        )
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length


class TemplateError(InvalidRequest):
    """A message list the chat template cannot render (unknown role, tool result without a call id, ...)."""


class AuthenticationError(PolarError):
    """No credentials, or a key that belongs to no session. Sessions are never auto-created."""

    status_code = 401
    error_type = "authentication_error"


class PermissionDenied(PolarError):
    """Valid credentials that may not do this: a closed session, another session's data, no control token."""

    status_code = 403
    error_type = "permission_error"


class NotFound(PolarError):
    status_code = 404
    error_type = "not_found_error"


class ClientClosed(PolarError):
    """The caller hung up before its request was read whole. Nobody receives the answer; it is counted (outcome
    ``client_closed``, nginx's 499), not logged as a gateway fault."""

    status_code = 499
    error_type = "client_closed"


class PayloadTooLarge(InvalidRequest):
    status_code = 413
    error_type = "request_too_large"


class BackendError(PolarError):
    """The inference backend failed."""

    status_code = 502
    error_type = "backend_error"


class BackendUnavailable(BackendError):
    """The backend could not be reached (connection refused, DNS, timeout)."""

    status_code = 503
    error_type = "backend_unavailable"


class BackendTimeout(BackendUnavailable):
    """The backend did not finish a generation within the gateway's deadline (``POLAR_BACKEND_DEADLINE_S``)."""

    status_code = 504
    error_type = "backend_timeout"


class Overloaded(BackendError):
    """Every in-flight slot of the inference server stayed taken until the call's queue deadline. Each protocol
    answers it with its provider's own overload error (OpenAI 429, Anthropic 529 ``overloaded_error``, Google
    503 ``UNAVAILABLE``) and a ``Retry-After`` header, so the SDKs back off and retry."""

    status_code = 429
    error_type = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BackendProtocolError(BackendError):
    """The backend answered, but not in the wire format we expect."""

    error_type = "backend_protocol_error"


class GenerationAborted(BackendError):
    """The backend aborted the generation (pause in abort mode, explicit abort)."""

    error_type = "generation_aborted"


class StoreError(PolarError):
    """The store (database) failed or is unreachable."""

    status_code = 503
    error_type = "store_unavailable"


RETRY_AFTER_S = 1
"""``Retry-After`` of a store or backend outage (503, 504): a client waits a little, never retries in a tight loop."""


def retry_after(exc: PolarError) -> int | None:
    """Seconds a client should wait before retrying ``exc``; None when retrying cannot help (not a retryable error).
    Both servers answer every retryable error with it: overload (its queue's own estimate), store and backend
    outages."""
    if isinstance(exc, Overloaded):
        return exc.retry_after_s
    if isinstance(exc, StoreError | BackendUnavailable):
        return RETRY_AFTER_S
    return None


class NotConfigured(PolarError):
    """The server lacks the configuration an endpoint needs (e.g. no gateway to push weights to)."""

    status_code = 503
    error_type = "not_configured"


class ConfigError(PolarError):
    """A configuration that cannot work, found at start: a model folder without a tokenizer, an unknown chat
    format, a tokenizer that disagrees with the backend. Nothing is started when it is raised."""

    status_code = 500
    error_type = "configuration_error"


class Conflict(PolarError):
    """The request collides with the current state of a resource (e.g. another flow run owns a rollout)."""

    status_code = 409
    error_type = "conflict_error"


class RolloutClaimed(Conflict):
    """Another flow run holds this rollout; two runs of one rollout would run its harness twice."""


class StageOrderError(Conflict):
    """A stage was asked to run before the stage it depends on finished."""


class SandboxError(PolarError):
    """A runtime could not be started, could not run a command, or lost its files."""

    error_type = "runtime_error"


class PrepareFailed(SandboxError):
    """A prepare action of a runtime failed on every one of its attempts."""

    error_type = "prepare_failed"


class HarnessError(PolarError):
    """A harness could not be configured or launched (not: the harness ran and failed, which is an outcome)."""

    error_type = "harness_error"


class EvaluationError(PolarError):
    """An evaluator could not produce a trustworthy reward (crashed, timed out, unparseable verdict)."""

    error_type = "evaluation_error"


class BatchStopped(PolarError):
    """A batch's circuit breaker tripped: too many of its rollouts failed for infrastructure reasons in a row (a
    broken image, a crashing verifier), so the rest were cancelled instead of failing the same way."""

    status_code = 503
    error_type = "batch_stopped"


class ArtifactMissing(PolarError):
    """A file a stage needs from an earlier one (on another host, its runtime folder gone) was never stored."""

    status_code = 409
    error_type = "artifact_missing"


class GatewayError(PolarError):
    """The gateway's control API failed or could not be reached while opening or closing a session."""

    status_code = 502
    error_type = "gateway_error"


class PartialPush(GatewayError):
    """New weights reached only some gateways (after retries); the message names which have them."""

    error_type = "partial_weight_push"


class TokenizerMismatch(Conflict):
    """A trainer's tokenizer is not the one Polar renders and samples with, so token ids would not line up."""

    error_type = "tokenizer_mismatch"


class GroupFailed(PolarError):
    """No sample of a rollout group can train (every rollout failed or is masked); a trainer gets no tensors."""

    error_type = "group_failed"
