"""Simulate one training step of a Job: replay measured times or predict a new setting.

``simulate(job, mode="replay")`` replays the measured durations and re-creates the waits
between ranks; ``simulate(job, mode="predict", comm_model=...)`` prices every collective
with the CC model and slows compute that overlaps communication. ``validate`` compares both
with each rank's measured step time. See ``docs/simulator.md``.
"""

from echo_et.sim.predict import Predictor
from echo_et.sim.result import RankResult, SimResult
from echo_et.sim.simulator import CommCall, SimOptions, Simulator
from echo_et.sim.validate import simulate, validate

__all__ = [
    "CommCall",
    "Predictor",
    "RankResult",
    "SimOptions",
    "SimResult",
    "Simulator",
    "simulate",
    "validate",
]
