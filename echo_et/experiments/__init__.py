"""Studies that combine passes, models and the simulator (sweeps, exports checked by replay)."""
