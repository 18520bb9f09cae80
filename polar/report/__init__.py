"""Reports and analysis over the store, in one package.

- ``analysis``: pandas loaders over the SQL views (rewards by harness/version, stage latencies, failures);
- ``build`` and ``plots``: ``polar report``, a run or a date range as PNG plots and one self-contained HTML page
  (matplotlib is imported only there: ``from polar.report.build import build_report``);
- ``rollouts``: the per-rollout table ``polar run`` and the demo print;
- ``merges``: merge statistics per harness (captures, merged traces, merge ratio, exact rate).
"""
