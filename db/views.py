"""The analysis views (revisions 0005 and 0009), one row shape on both databases. Query them with SQL or with
``polar.report.analysis`` (pandas).

- ``rollout_facts``: one row per rollout: task name, harness, builder, status, reward, attempt, weight-version
  range (``version_id``: the registration order of its oldest version, NULL if never registered), timestamps,
  per-stage seconds (``init_s``, ``run_s``, ``postrun_s``, ``evaluate_s``), the stage a pipeline failure was in,
  and the error text.
- ``rewards_by_harness_task_version``: finished rollouts grouped by harness, task name and oldest weight version:
  counts, mean reward, solved (reward >= 1).
- ``token_counts``: per rollout: captures, prompt tokens (full and delta), output tokens.
- ``merge_ratio``: per harness and builder: captures in, traces out, ``merge_ratio`` = non-error captures per
  trace, ``exact_rate`` = merges whose next prompt held the sampled ids verbatim, breaks, tokens; since 0009 also
  chain starts by role (``main_roots``, ``sub_agent_roots``, ``compaction_roots``, ``title_roots``,
  ``other_roots``) and splits by cause (``branch_splits``, ``compaction_splits``, ``prompt_rewritten_splits``,
  ``parent_failed_splits``, ``reply_not_found_splits``, ``no_end_of_turn_id_splits``).
- ``trajectory_roles`` (0009): per harness, builder, role and ``compacted`` (starts from a compaction summary):
  trajectories, rollouts, captures, response and loss tokens, trainable trajectories, how many are linked to the
  call they came from, mean reward.
- ``stage_latencies``: per harness: mean and max seconds of each stage.
- ``failure_causes``: ERROR/TIMEOUT/CANCELLED rollouts grouped by harness, status, failed stage and error text.

Example queries::

    -- reward over weight versions, per harness
    SELECT harness, weight_version, SUM(rollouts) AS n, AVG(mean_reward) AS reward
    FROM rewards_by_harness_task_version GROUP BY harness, weight_version, version_id ORDER BY harness, version_id;

    -- the slowest harnesses to run
    SELECT harness, run_mean_s, run_max_s FROM stage_latencies ORDER BY run_mean_s DESC;

    -- what fails, most often first
    SELECT harness, status, failed_stage, cause, rollouts FROM failure_causes ORDER BY rollouts DESC LIMIT 20;

    -- what sub-agents and compaction add, per harness
    SELECT harness, role, compacted, trajectories, trainable, loss_tokens FROM trajectory_roles
    WHERE builder = 'prefix_merge' ORDER BY harness, role;

    -- tokens per task
    SELECT task_name, SUM(captures) AS calls, SUM(output_tokens) AS sampled FROM token_counts GROUP BY task_name;
"""

VIEW_NAMES = (
    "rollout_facts",
    "rewards_by_harness_task_version",
    "token_counts",
    "merge_ratio",
    "stage_latencies",
    "failure_causes",
    "trajectory_roles",
)
