"""``attr-tui STORE.h5``: open a store and browse it. Errors are one line on stderr and exit 1 (2 for usage)."""

from __future__ import annotations

import os
import sys
import warnings

import click

from store import StoreError, open_store, verify
from store.text import printable_text

from .colors import COLORMAPS, DEFAULT_COLORMAP, MODES

# A store up to this size is read whole before the app starts (about 1 s on a loaded 2-core machine: 90 MB took
# 2.5-3.2 s): a damaged one is refused in one line. A larger one is read on a worker once the app runs, and damage
# is a notification.
VERIFY_AT_OPEN_BYTES = 32 * 1000 * 1000


#: Where --serve listens by default: this machine only (reach it from another through an SSH tunnel).
SERVE_HOST, SERVE_PORT = "127.0.0.1", 8000
#: How many browser tabs' apps --serve runs at once by default (each is a process of 40 MB or more).
SERVE_MAX_SESSIONS = 4


def _serve(store: str, host: str, port: int, max_sessions: int, color: str, colormap: str, debug: bool) -> None:
    from .serve import serve, tab_count

    def listening(url: str, token: bool) -> None:
        only = ", only with this token" if token else ""
        click.echo(f"attr-tui: serving {store} on {url} to at most {tab_count(max_sessions)} at once{only} "
                   "(Ctrl-C stops it)", err=True)

    try:
        serve(store, host, port, color=color, colormap=colormap, debug=debug, max_sessions=max_sessions,
              listening=listening)
    except OSError as err:  # the address is taken, or not this machine's
        if debug:
            raise
        _fail(f"cannot listen on {host}:{port}: {err.strerror or err}; choose another --port or --host")


def _fail(message: str) -> None:
    one_line = printable_text(" ".join(message.split()))  # HDF5 messages may carry line breaks; paths escapes
    click.echo(f"attr-tui: error: {one_line}", err=True)
    sys.exit(1)


class OneLineUsageErrors(click.Command):
    """Usage errors in one line, exit 2, like attr-compute's (click's default prints usage and a hint over four)."""

    def main(self, args=None, prog_name=None, **extra):
        extra.pop("standalone_mode", None)
        try:
            return super().main(args, prog_name or "attr-tui", standalone_mode=False, **extra)
        except click.UsageError as err:
            click.echo(f"attr-tui: error: {printable_text(' '.join(err.format_message().split()))} "
                       "(see attr-tui --help)", err=True)
            sys.exit(2)
        except click.exceptions.Abort:  # Ctrl-C before the app started
            sys.exit(130)


@click.command(cls=OneLineUsageErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("store", metavar="STORE.h5")
@click.option("--color-system", "--color", "color", type=click.Choice(("auto",) + MODES), default="auto",
              show_default=True,
              help="Colour system; auto reads NO_COLOR, COLORTERM and TERM like rich does (mono: glyphs, no colour).")
@click.option("--colormap", type=click.Choice(tuple(COLORMAPS)), default=DEFAULT_COLORMAP, show_default=True,
              help="dark: black at zero (dark terminals); light: white at zero (light terminals, as in papers). "
                   "The palette switches it too.")
@click.option("--serve", is_flag=True,
              help="Serve the app to a web browser (one app per tab) instead of running it in this terminal.")
@click.option("--host", metavar="H", help=f"With --serve: the address to listen on  [default: {SERVE_HOST}].")
@click.option("--port", metavar="P", type=click.IntRange(1, 65535),
              help=f"With --serve: the port to listen on  [default: {SERVE_PORT}].")
@click.option("--max-sessions", metavar="N", type=click.IntRange(min=1),
              help=f"With --serve: how many browser tabs' apps run at once; another tab is refused until one "
                   f"closes  [default: {SERVE_MAX_SESSIONS}].")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
def main(store: str, color: str, colormap: str, serve: bool, host: str | None, port: int | None,
         max_sessions: int | None, debug: bool) -> None:
    """Browse the token attributions in STORE.h5 (written by attr-compute; it may still be writing)."""
    if not serve and (host is not None or port is not None or max_sessions is not None):
        raise click.UsageError("--host, --port and --max-sessions go with --serve")

    try:
        with warnings.catch_warnings():  # a newer-format note is shown inside the app (Store.warnings)
            warnings.simplefilter("ignore")
            s = open_store(store)
        later = os.path.getsize(store) > VERIFY_AT_OPEN_BYTES
        if not later:
            try:
                verify(s)
            except BaseException:
                s.close()
                raise
    except StoreError as err:
        if debug:
            raise
        _fail(str(err))
    except Exception as err:  # e.g. a store whose header is damaged
        if debug:
            raise
        _fail(f"cannot open '{store}': {type(err).__name__}: {err}")
    if serve:  # the store opened: each tab's app opens it again
        s.close()
        _serve(store, host or SERVE_HOST, port or SERVE_PORT, max_sessions or SERVE_MAX_SESSIONS, color, colormap,
               debug)
        return
    from .app import create_app  # after argument parsing: `attr-tui --help` stays fast

    try:
        app = create_app(s, color_mode=color, colormap=colormap, verify_store=later)
        app.run()
    finally:
        s.close()
    sys.exit(app.return_code or 0)


if __name__ == "__main__":
    main()
