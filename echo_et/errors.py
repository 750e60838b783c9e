"""User-facing errors: one line that says what is wrong and where; the CLI exits 2 on them."""


class EchoError(Exception):
    """Bad input or an impossible request. The message is shown to the user as is."""


class CheckError(EchoError):
    """A Job or graph violates an IR invariant (see :mod:`echo_et.ir.checker`)."""
