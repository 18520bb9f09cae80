"""The store's tables as SQLAlchemy 2 typed models.

Tables: ``weight_versions``, ``tasks``, ``submissions`` (idempotency keys of task submissions), ``rollouts`` (one
sample of a task = one gateway session), ``captures`` (one backend call, forming a tree per session),
``trajectories`` (training sequences built from captures, with the weight version and sampling regime of each span
of sampled tokens), ``merge_stats`` (what each trajectory build did with a rollout's captures), ``evaluations``,
``claims`` (trainers' leases on complete groups), ``rollout_artifacts`` (files a later stage needs on any host) and
``gateways`` (running gateway replicas). Token arrays use the portable types of ``db.types``; every count a query
may want is a plain integer column, so SQL never unpacks an array.

Statuses are ``StrEnum``s stored as ``VARCHAR(16)`` without a native enum type or CHECK constraint: adding a
status is then a code change, not a migration, and autogenerate compares the column exactly like the
``String(16)`` the migrations create, on both databases. Values are validated when written.

Relationships are ``lazy="raise"``: load them explicitly (``selectinload``) so no query runs by surprise.
Child rows go with their rollout (``ON DELETE CASCADE``, honoured by the database, not by loading rows).
Every change here ships an Alembic revision in ``db/migrations/versions``; the test suite checks they agree.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship

# Base is re-exported: importing it from here guarantees every table below is registered on its metadata.
from db.base import Base as Base
from db.base import BigId, created_at_column, new_uuid, rollout_fk, status_column
from db.enums import CaptureStatus, ClaimStatus, RolloutStatus, TaskStatus
from db.stage_results import StageResults
from db.types import FloatArray, IntArray, JSONType, UTCDateTime


class WeightVersion(Base):
    """A published policy weight version; the current one is the latest row (highest id)."""

    __tablename__ = "weight_versions"

    id: Mapped[int] = mapped_column(primary_key=True)
    version: Mapped[str] = mapped_column(sa.String(128), unique=True)
    created_at: Mapped[datetime] = created_at_column()
    checkpoint_uri: Mapped[str | None] = mapped_column(sa.Text)
    notes: Mapped[str | None] = mapped_column(sa.Text)


class Task(Base):
    """One task request: run ``num_samples`` rollouts of a harness on an instruction and evaluate them."""

    __tablename__ = "tasks"

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_uuid)
    name: Mapped[str | None] = mapped_column(sa.String(128))
    instruction: Mapped[str] = mapped_column(sa.Text)
    harness: Mapped[dict[str, Any]] = mapped_column(JSONType())
    runtime: Mapped[dict[str, Any]] = mapped_column(JSONType())
    evaluator: Mapped[dict[str, Any]] = mapped_column(JSONType())
    builder: Mapped[str] = mapped_column(sa.String(64), server_default="prefix_merge")
    # polar.trajectory.choices.BuilderOptions as JSON (train_roles, reward routing); NULL: the defaults.
    builder_options: Mapped[dict[str, Any] | None] = mapped_column(JSONType())
    num_samples: Mapped[int]
    timeout_s: Mapped[float | None]  # the shared deadline of init and run
    agent_timeout_s: Mapped[float | None]  # the agent budget, counted from the harness launch
    priority: Mapped[int] = mapped_column(server_default="0")
    # "metadata" is reserved on declarative classes, hence the attribute name.
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType(), default=dict)
    status: Mapped[TaskStatus] = mapped_column(status_column(TaskStatus), default=TaskStatus.PENDING, index=True)
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=sa.func.now(), onupdate=sa.func.now())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # when its last sample finished
    dispatched_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # when its runner took it
    # The one runner that starts its rollouts (polar.rollout.dispatcher); NULL while the control API may take it.
    dispatcher: Mapped[str | None] = mapped_column(sa.String(128))
    # The claim that holds (ACTIVE) or consumed (ACKED) this task's group; NULL while it is claimable.
    claim_id: Mapped[str | None] = mapped_column(sa.String(36), sa.ForeignKey("claims.id"), index=True)
    callback_url: Mapped[str | None] = mapped_column(sa.Text)
    callback_state: Mapped[dict[str, Any] | None] = mapped_column(JSONType())  # webhook attempts and delivery

    rollouts: Mapped[list[Rollout]] = relationship(back_populates="task", lazy="raise", passive_deletes=True)


class Submission(Base):
    """One ``POST /v1/tasks`` made with an ``Idempotency-Key``: a retry with the same key gets the same tasks.

    The row is inserted in the transaction that stores the tasks, so a key names one batch or none;
    ``request_sha256`` (of the canonical JSON of the batch) tells a true retry from a different batch.
    """

    __tablename__ = "submissions"

    key: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    request_sha256: Mapped[str] = mapped_column(sa.String(64))
    task_ids: Mapped[list[str]] = mapped_column(JSONType())
    created_at: Mapped[datetime] = created_at_column()


class Claim(Base):
    """A trainer's lease on a batch of complete groups (tasks whose samples all finished).

    Exactly-once delivery: a group is handed out only while ``tasks.claim_id`` is NULL, and the claim that takes
    it sets that column in the same transaction. ``ACKED`` keeps the groups consumed; ``RELEASED`` and
    ``EXPIRED`` (the lease ran out: a crashed trainer) clear ``tasks.claim_id`` so another trainer gets them.
    """

    __tablename__ = "claims"

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_uuid)
    trainer: Mapped[str] = mapped_column(sa.String(128))
    status: Mapped[ClaimStatus] = mapped_column(status_column(ClaimStatus), default=ClaimStatus.ACTIVE, index=True)
    n_groups: Mapped[int]
    n_trajectories: Mapped[int]
    created_at: Mapped[datetime] = created_at_column()
    lease_expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class Rollout(Base):
    """One sample of a task, which is one gateway session (a session may also exist without a task).

    ``stage`` is the last completed stage and ``stage_results`` holds each completed stage's output, so a retried
    rollout resumes at the failed stage. The weight-version range spans every capture of the session.
    ``flow_run_id`` names the flow run that owns the rollout (``polar.rollout.state.claim``); ``deadline_at`` is
    the shared deadline of init and run, ``heartbeat_at`` the owner's last sign of life.
    """

    __tablename__ = "rollouts"

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_uuid)
    task_id: Mapped[str | None] = mapped_column(
        sa.String(36), sa.ForeignKey("tasks.id", ondelete="CASCADE"), index=True
    )
    sample_index: Mapped[int] = mapped_column(server_default="0")
    status: Mapped[RolloutStatus] = mapped_column(
        status_column(RolloutStatus), default=RolloutStatus.PENDING, index=True
    )
    stage: Mapped[str | None] = mapped_column(sa.String(32))
    stage_results: Mapped[dict[str, Any]] = mapped_column(JSONType(), default=dict)
    stage_timings: Mapped[dict[str, Any]] = mapped_column(JSONType(), default=dict)
    attempt: Mapped[int] = mapped_column(server_default="0")
    flow_run_id: Mapped[str | None] = mapped_column(sa.String(64))
    dispatch_id: Mapped[str | None] = mapped_column(sa.String(64))  # the Prefect flow run created for it, if any
    error: Mapped[str | None] = mapped_column(sa.Text)
    reward: Mapped[float | None]
    weight_version_min: Mapped[str | None] = mapped_column(sa.String(128))
    weight_version_max: Mapped[str | None] = mapped_column(sa.String(128))
    # SHA-256 hex of the session's secret token; the token itself is never stored.
    session_token_hash: Mapped[str | None] = mapped_column(sa.String(64), unique=True)
    # How the session's model replies are produced when not sampled freely (e.g. scripted replies in tests).
    policy: Mapped[dict[str, Any] | None] = mapped_column(JSONType())
    created_at: Mapped[datetime] = created_at_column()
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The seq the next capture of this rollout gets: writers increment it in their insert transaction.
    next_capture_seq: Mapped[int] = mapped_column(default=0, server_default="0")

    task: Mapped[Task | None] = relationship(back_populates="rollouts", lazy="raise")
    captures: Mapped[list[Capture]] = relationship(back_populates="rollout", lazy="raise", passive_deletes=True)
    trajectories: Mapped[list[Trajectory]] = relationship(back_populates="rollout", lazy="raise", passive_deletes=True)
    evaluations: Mapped[list[Evaluation]] = relationship(back_populates="rollout", lazy="raise", passive_deletes=True)
    merge_stats: Mapped[list[MergeStat]] = relationship(back_populates="rollout", lazy="raise", passive_deletes=True)

    @property
    def results(self) -> StageResults:
        """``stage_results`` typed (``db.stage_results``); writers still assign the JSON column."""
        return StageResults.of(self.stage_results)


class Capture(Base):
    """One backend call made through the gateway, with the exact token ids and logprobs it sampled.

    Capture-tree contract. A capture ``c`` with parent ``p`` extends ``p``'s conversation::

        parent_sequence(c) = full_prompt_ids(p) + p.output_ids
        full_prompt_ids(c) = parent_sequence(c)[:c.prefix_len] + c.prompt_delta_ids

    A root has no parent, ``prefix_len == 0`` and its delta is its whole prompt. In append mode ``prefix_len``
    is the whole parent sequence; a canonical re-render that shares only part of it has a shorter
    ``prefix_len``. Storage grows with the tokens of a session, not with turns x context; root-to-leaf
    paths are the merged trajectories. ``db.capture_tree.full_prompt_ids`` rebuilds a full prompt.
    Counts are stored: ``n_prompt == len(full_prompt_ids(c))``, ``n_prompt_delta == len(prompt_delta_ids)``,
    ``n_output == len(output_ids)``; the writer sets them.

    ``version_spans`` lists ``{"version", "start", "end"}`` ranges of output token positions sampled under each
    weight version (a generation can straddle a weight update); ``weight_version`` is the one it finished under
    (SGLang's ``meta_info.weight_version``, the last span).
    ``logprob_semantics`` says how the backend computed logprobs (e.g. scaled by temperature or not).
    ``sampling_params`` are the parameters the engine was sent (SGLang names: temperature, top_p, top_k, min_p,
    ...): with ``logprob_semantics`` they are the sampling regime of the whole output, the capture's one sampling
    span (``polar.trajectory.sampling``).
    ``server`` is the inference server of a fleet that produced it (None with one server): a session that moved
    to another server (its first one died) shows a change of ``server`` between its captures.
    ``n_malformed_tool_calls`` counts tool calls in the reply the gateway could not parse (their traces get
    reward 0, see ``polar.trajectory.training_filter``).
    ``seq`` orders the captures of a rollout; the unique ``(rollout_id, seq)`` index also serves lookups by
    rollout, so ``rollout_id`` has no index of its own (one index less on the gateway's hot insert path).
    """

    __tablename__ = "captures"
    __table_args__ = (sa.UniqueConstraint("rollout_id", "seq"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    rollout_id: Mapped[str] = rollout_fk(index=False)
    seq: Mapped[int]
    protocol: Mapped[str] = mapped_column(sa.String(32))  # openai_chat | openai_responses | anthropic_messages | ...
    model: Mapped[str] = mapped_column(sa.String(256))
    request_json: Mapped[dict[str, Any]] = mapped_column(JSONType())
    response_json: Mapped[dict[str, Any] | None] = mapped_column(JSONType())
    parent_id: Mapped[int | None] = mapped_column(BigId, sa.ForeignKey("captures.id"), index=True)
    prefix_len: Mapped[int] = mapped_column(server_default="0")
    prompt_delta_ids: Mapped[list[int]] = mapped_column(IntArray())
    output_ids: Mapped[list[int]] = mapped_column(IntArray())
    output_logprobs: Mapped[list[float]] = mapped_column(FloatArray())
    finish_reason: Mapped[str | None] = mapped_column(sa.String(32))
    matched_stop: Mapped[Any | None] = mapped_column(JSONType())
    weight_version: Mapped[str | None] = mapped_column(sa.String(128))
    version_spans: Mapped[list[dict[str, Any]]] = mapped_column(JSONType(), default=list)
    sampling_params: Mapped[dict[str, Any]] = mapped_column(JSONType(), default=dict)
    render_mode: Mapped[str] = mapped_column(sa.String(16))  # append | canonical
    fallback_reason: Mapped[str | None] = mapped_column(sa.Text)  # why append mode did not apply, when asked
    backend: Mapped[str] = mapped_column(sa.String(32))
    server: Mapped[str | None] = mapped_column(sa.String(256))
    logprob_semantics: Mapped[str | None] = mapped_column(sa.String(32))
    status: Mapped[CaptureStatus] = mapped_column(status_column(CaptureStatus), default=CaptureStatus.OK)
    error: Mapped[str | None] = mapped_column(sa.Text)
    latency_s: Mapped[float | None]
    ttft_s: Mapped[float | None]
    n_prompt: Mapped[int]
    n_prompt_delta: Mapped[int]
    n_output: Mapped[int]
    n_malformed_tool_calls: Mapped[int] = mapped_column(default=0, server_default="0")
    # Made by a scripted policy (tests, demos), not sampled: never trained on, left out of exports by default.
    scripted: Mapped[bool] = mapped_column(default=False, server_default=sa.false())
    # Extras, only where the session asked (``polar.capture_extras``; NULL otherwise). Top-k: ``top_k`` ids per
    # sampled token, int32 little-endian (n_output, top_k), and their logprobs, float32 or float16 (the width
    # tells). Routed experts: uint8 (up to 256 experts) or uint16 per (position, layer, k) for the positions
    # ``[experts_start, n_prompt + n_output - 1)``: a call extending its parent holds only what the parent lacks.
    top_k: Mapped[int | None]
    top_ids: Mapped[bytes | None] = mapped_column(sa.LargeBinary)
    top_logprobs: Mapped[bytes | None] = mapped_column(sa.LargeBinary)
    experts_start: Mapped[int | None]
    experts_layers: Mapped[int | None]
    experts_k: Mapped[int | None]
    routed_experts: Mapped[bytes | None] = mapped_column(sa.LargeBinary)
    # How the gateway admitted the call (db.enums.Admission: root | match | unresolved; NULL before revision
    # 0017) and, for a root after the session's first call or an unresolved call, why (``tools_changed``, ...).
    admission: Mapped[str | None] = mapped_column(sa.String(16))
    admission_cause: Mapped[str | None] = mapped_column(sa.String(32))
    created_at: Mapped[datetime] = created_at_column()

    rollout: Mapped[Rollout] = relationship(back_populates="captures", lazy="raise")


class Trajectory(Base):
    """One training sequence built from a rollout's captures by ``builder`` (one per chain of the tree).

    ``prompt_ids`` is the chain root's prompt; ``response_ids``, ``loss_mask`` and ``response_logprobs`` are
    aligned (same length): mask 1 on sampled tokens, 0 on inserted ones. ``capture_ids`` lists the chain's
    captures in order. A trainer claims a row by setting ``consumed_by``/``consumed_at``.
    ``finish_reason`` is the chain's last call's; ``n_inexact_merges`` counts merges whose next prompt did not
    hold the sampled ids verbatim; ``n_malformed_tool_calls`` sums the chain's unparseable tool calls;
    ``filter_reason`` says why the fail-closed training filter zeroed the mask or the reward (NULL: untouched).
    ``role`` is the chain's role (main, sub_agent, compaction, title, other: ``polar.trajectory.roles``),
    ``source_capture_id`` the capture it came from (a sub-agent's launching call, the call a compaction
    summarised, a post-compaction chain's compaction call; no foreign key, captures are never deleted alone),
    ``compacted`` whether the chain starts from a compaction summary. ``sampling_spans`` (revision 0020; NULL on
    rows built before) lists ``{"start", "end", "temperature", "top_p", "top_k", "min_p", "logprob_semantics",
    "greedy"}`` ranges of response positions, one per sampling regime of the chain's calls, beside
    ``version_spans`` (``polar.trajectory.sampling``). ``polar.trajectory.store`` writes these rows.
    """

    __tablename__ = "trajectories"
    # The unique index leads with rollout_id, so it also serves lookups by rollout.
    __table_args__ = (sa.UniqueConstraint("rollout_id", "builder", "chain_index"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    rollout_id: Mapped[str] = rollout_fk(index=False)
    builder: Mapped[str] = mapped_column(sa.String(64))
    chain_index: Mapped[int]
    capture_ids: Mapped[list[int]] = mapped_column(JSONType())
    prompt_ids: Mapped[list[int]] = mapped_column(IntArray())
    response_ids: Mapped[list[int]] = mapped_column(IntArray())
    loss_mask: Mapped[list[int]] = mapped_column(IntArray())
    response_logprobs: Mapped[list[float]] = mapped_column(FloatArray())
    reward: Mapped[float | None]
    weight_version_min: Mapped[str | None] = mapped_column(sa.String(128))
    weight_version_max: Mapped[str | None] = mapped_column(sa.String(128))
    version_spans: Mapped[list[dict[str, Any]]] = mapped_column(JSONType(), default=list)
    sampling_spans: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType(), default=list)
    turn_count: Mapped[int]
    n_prompt: Mapped[int]
    n_response: Mapped[int]
    n_loss_tokens: Mapped[int]
    status: Mapped[str] = mapped_column(sa.String(16))  # the rollout outcome it came from, e.g. COMPLETED, TIMEOUT
    finish_reason: Mapped[str | None] = mapped_column(sa.String(32))
    n_inexact_merges: Mapped[int] = mapped_column(default=0, server_default="0")
    n_malformed_tool_calls: Mapped[int] = mapped_column(default=0, server_default="0")
    scripted: Mapped[bool] = mapped_column(default=False, server_default=sa.false())  # holds a scripted capture
    filter_reason: Mapped[str | None] = mapped_column(sa.String(32))
    role: Mapped[str] = mapped_column(sa.String(16), default="main", server_default="main")
    source_capture_id: Mapped[int | None] = mapped_column(sa.BigInteger())
    compacted: Mapped[bool] = mapped_column(default=False, server_default=sa.false())
    # Revision 0017: the chain the harness kept (the first trace through the session's terminal call, found from
    # the calls it continued: ``polar.trajectory.liveness``); the trainer adapters train this one per rollout.
    kept: Mapped[bool] = mapped_column(default=False, server_default=sa.false())
    consumed_by: Mapped[str | None] = mapped_column(sa.String(128))
    consumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = created_at_column()

    rollout: Mapped[Rollout] = relationship(back_populates="trajectories", lazy="raise")


class MergeStat(Base):
    """What one trajectory build did with a rollout's captures; one row per (rollout, builder), replaced on rebuild.

    Plain counts, so SQL aggregates them directly: merge ratio ``(captures_in - error_captures) / traces_out``,
    conditioning-exact rate ``exact_merges / (exact_merges + inexact_merges)``. ``breaks`` is the sum of
    ``break_causes`` (cause -> count, e.g. ``{"prompt_rewritten": 2, "branch": 1}``; every split is counted, so
    ``traces_out == roots + breaks``). ``roots_by_role`` counts chain starts by role (``{"main": 1, "sub_agent":
    1, "compaction": 1}``). ``loss_tokens`` is counted before the training filter and equals ``sampled_tokens``
    when every sampled token is trained exactly once.
    """

    __tablename__ = "merge_stats"
    __table_args__ = (sa.UniqueConstraint("rollout_id", "builder"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    rollout_id: Mapped[str] = rollout_fk(index=False)
    builder: Mapped[str] = mapped_column(sa.String(64))
    captures_in: Mapped[int]
    error_captures: Mapped[int]
    traces_out: Mapped[int]
    roots: Mapped[int]
    exact_merges: Mapped[int]
    inexact_merges: Mapped[int]
    breaks: Mapped[int]
    break_causes: Mapped[dict[str, int]] = mapped_column(JSONType(), default=dict)
    roots_by_role: Mapped[dict[str, int] | None] = mapped_column(JSONType(), default=dict)
    sampled_tokens: Mapped[int]
    loss_tokens: Mapped[int]
    # Revision 0017: sampled tokens not trained, by reason (poisoned, dead_branch, unacknowledged, and after the
    # training filter its reasons: role_not_trained, rollout_error, ...); loss tokens after the filter; the causes
    # the gateway recorded for roots after the first call and for unresolved calls.
    untrained_tokens: Mapped[dict[str, int] | None] = mapped_column(JSONType(), default=dict)
    trainable_tokens: Mapped[int | None]
    root_causes: Mapped[dict[str, int] | None] = mapped_column(JSONType(), default=dict)
    created_at: Mapped[datetime] = created_at_column()

    rollout: Mapped[Rollout] = relationship(back_populates="merge_stats", lazy="raise")


class Evaluation(Base):
    """One evaluator's verdict on a rollout."""

    __tablename__ = "evaluations"

    id: Mapped[int] = mapped_column(primary_key=True)
    rollout_id: Mapped[str] = rollout_fk(index=True)
    evaluator: Mapped[str] = mapped_column(sa.String(64))
    reward: Mapped[float]
    details: Mapped[dict[str, Any]] = mapped_column(JSONType(), default=dict)
    duration_s: Mapped[float | None]
    created_at: Mapped[datetime] = created_at_column()

    rollout: Mapped[Rollout] = relationship(back_populates="evaluations", lazy="raise")


class RolloutArtifact(Base):
    """A file a later stage of a rollout needs on any host (the agent's diff, files the evaluator reads, the
    harness's logs): its bytes here (``content``, size-capped) or at ``url`` under ``POLAR_ARTIFACT_URL``."""

    __tablename__ = "rollout_artifacts"
    __table_args__ = (sa.UniqueConstraint("rollout_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    rollout_id: Mapped[str] = rollout_fk(index=True)
    name: Mapped[str] = mapped_column(sa.String(512))
    size: Mapped[int] = mapped_column(sa.BigInteger)
    sha256: Mapped[str] = mapped_column(sa.String(64))
    content: Mapped[bytes | None] = mapped_column(sa.LargeBinary)
    url: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = created_at_column()


class Gateway(Base):
    """A running gateway replica: where the control API pushes weights; live while ``heartbeat_at`` is recent."""

    __tablename__ = "gateways"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    url: Mapped[str] = mapped_column(sa.Text)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    draining_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # it announced a shutdown
