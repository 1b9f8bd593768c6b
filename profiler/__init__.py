"""diagtrain's toolkit core, one sub-package per stage of the flow (docs/contributing/architecture.md):

- :mod:`~diagtrain.profiler.rank`: inside the user's ranks (bootstrap, step hooks, profiler
  windows, state dumps); where a bug would break the user's job.
- :mod:`~diagtrain.profiler.collect`: beside the job, in the `diagtrain run` wrapper (process
  tree, telemetry, progress, hang watchdog, manifest).
- :mod:`~diagtrain.profiler.analyzer`: after the run (traces → tables → detectors → findings →
  report).
- :mod:`~diagtrain.profiler.compare`: across runs (baselines, the regression gate).
- :mod:`~diagtrain.profiler.run_dir`: the run-directory contract every stage imports;
  :mod:`~diagtrain.profiler.util`: small shared helpers; :mod:`~diagtrain.profiler.cli`: the verbs,
  the only code that calls across stages.

Importing this package does not import torch; the modules that need it import it themselves.
"""
