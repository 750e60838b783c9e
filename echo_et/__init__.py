"""echo-et: execution graphs of distributed training jobs.

Ingest profiler traces, trace jobs ex-situ, rewrite graphs, simulate a step and export to
other simulators. The IR lives in :mod:`echo_et.ir`; converters in :mod:`echo_et.converters`.
"""

__version__ = "0.1.0"

from echo_et.errors import EchoError  # noqa: E402

__all__ = ["EchoError", "__version__"]
