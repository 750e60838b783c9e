"""Models the simulator uses: the collective-communication cost model (``comm``) and the
overlap-slowdown model (``slowdown``)."""
