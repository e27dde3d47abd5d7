"""Running attr-compute in process (click's CliRunner) and reading its result, for every CLI test module."""

from __future__ import annotations

from click.testing import CliRunner

from compute.cli import main


def invoke(*args):
    """``attr-compute ARGS...`` in process; exceptions are kept on the result, not raised."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def ok(res):
    assert res.exit_code == 0, (res.exit_code, res.stderr, res.exception)
    return res


def one_line(res, code=1) -> str:
    """The one-line error of a refused command (exit ``code``, no traceback, not an internal error)."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == code and len(lines) == 1 and "Traceback" not in res.stderr, (res.exit_code, res.stderr)
    assert lines[0].startswith("attr-compute: error:") and "internal error" not in lines[0], lines[0]
    return lines[0]
