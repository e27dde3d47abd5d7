"""User-facing errors: one line that names the problem and the fix.

Each failure is raised once, where it is known, as one of these or as store/'s ``StoreError`` (a missing, damaged or
incompatible store; store/ cannot import compute/), and is not re-wrapped on its way up: the CLIs print ``str(err)``
once and exit with ``err.exit_code`` (1 for a StoreError); a traceback is shown only with ``--debug``.
"""


class AttrscopeError(Exception):
    """A problem with the user's input or environment (exit code 1)."""

    exit_code = 1


class UsageError(AttrscopeError):
    """A bad combination of command-line options (exit code 2)."""

    exit_code = 2
