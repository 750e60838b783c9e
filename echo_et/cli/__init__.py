"""The ``echo-et`` command line (typer): one verb per step of the pipeline."""
