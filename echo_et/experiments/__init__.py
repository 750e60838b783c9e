"""Experiments: what combines passes, models and the simulator into a study.

- :mod:`echo_et.experiments.sweep`: scale a Job to every point of a layout grid and simulate
  each point, on a local process pool, Dask or Ray;
- :mod:`echo_et.experiments.plots`: charts of those results (matplotlib, an optional extra);
- :mod:`echo_et.experiments.synthetic`: synthetic Jobs for simulator tests and benchmarks.

This part sits above passes, models and sim and below the CLI (docs/architecture.md).
"""
