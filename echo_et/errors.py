"""User-facing errors: one line that says what is wrong and where; the CLI exits 2 on them."""


class EchoError(Exception):
    """Bad input or an impossible request. The message is shown to the user as is."""


class OptionError(EchoError):
    """A value the caller chose is not allowed. The message speaks of values ("GPUs per node
    must be >= 1, got 0"); ``option`` is the library's name for the value (a keyword
    argument such as ``gpus_per_node``), so a front end can point at its own option for it
    (the CLI prefixes ``--gpus-per-node``) without the library knowing any flag."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


class CheckError(EchoError):
    """A Job or graph violates an IR invariant (see :mod:`echo_et.ir.checker`)."""
