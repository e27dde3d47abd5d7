"""User-facing errors: one line that names the problem and the fix.

The CLIs print ``str(err)`` and exit with ``err.exit_code``; a traceback is shown only with ``--debug``.
"""


class AttrscopeError(Exception):
    """A problem with the user's input or environment (exit code 1)."""

    exit_code = 1


class UsageError(AttrscopeError):
    """A bad combination of command-line options (exit code 2)."""

    exit_code = 2
