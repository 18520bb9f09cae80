"""Thin Prefect wrappers around ``polar.rollout``, one flow per module:

- ``rollout``: ``rollout(rollout_id)``, one flow run per rollout with four task runs (init, run, postrun,
  evaluate); ``build_rollout_flow`` builds it over other stage functions (benchmarks);
- ``batch``: ``rollout_batch(tasks, dispatch)`` submits tasks and runs every sample concurrently, in this process
  or as deployment runs on the work pool (``dispatch``);
- ``retry``: ``retry_failed(...)`` resumes failed rollouts and takes over ones whose flow run died;
- ``maintenance``: ``rebuild_trajectories(...)``;
- ``limits``: stage limits counted fleet-wide by the Prefect server (``POLAR_STAGE_LIMITS=prefect``);
- ``sft``: ``sft_generation(...)``, a task dataset through the pipeline, then an export of what was accepted;
- ``demo`` (with ``demo_tasks``): ``polar demo``, the embedded main job.

And what they share: ``dispatch`` (run many rollouts inline or as deployment runs), ``owners`` (whether a
rollout's owning flow run still runs), ``prefect_server`` (Prefect's settings and its temporary server),
``artifacts`` and ``alarms`` (what a rollout or batch writes to the Prefect UI).

The deployments are in the repository's ``prefect.yaml``.
"""
