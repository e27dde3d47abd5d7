"""``attr-tui STORE --serve``: the same app in a browser, through textual-serve.

The server listens on ``host:port`` (127.0.0.1 unless the user says otherwise: the app reads the store for anyone
who reaches the port) and starts one ``attr-tui STORE`` process per browser tab, which textual-serve's web driver
connects to the page over a websocket. SIGINT/SIGTERM stop the server, which closes every tab's app.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

APP_QUIT_SECONDS = 5  # a tab's app that has not quit this long after it was asked is killed


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def tab_allowed(origin: str | None, host: str, *, loopback_only: bool) -> bool:
    """Whether a websocket may start an app. A browser names the page that opens one (Origin): any web site the
    user visits could otherwise open ws://127.0.0.1:PORT/ws and read the store through the app, so the page must be
    this server's own (same host and port as the request's Host). Served on a loopback address, the Host must be a
    loopback name too, or a site that points its own name at 127.0.0.1 (DNS rebinding) would pass. A client
    without Origin is no browser page."""
    if origin is None:
        return True
    if urlsplit(origin).netloc != host:
        return False
    return not loopback_only or urlsplit("//" + host).hostname in LOOPBACK


def app_command(store: str, color: str, colormap: str, debug: bool = False) -> str:
    """The shell command that runs the app of one tab: this interpreter, the ``tui`` package this process imported
    (not whichever one the working directory holds), the store by its absolute path, and ``--debug`` if the server
    was given it (a tab's errors then show their tracebacks)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"import sys; sys.path.insert(0, {root!r}); from tui.cli import main; main()"
    args = [sys.executable, "-c", code, os.path.abspath(store), "--color", color, "--colormap", colormap]
    if debug:
        args.append("--debug")
    return "exec " + shlex.join(args)  # exec: the app is the shell's process, so stopping it leaves no shell behind


def serve(store: str, host: str, port: int, *, color: str, colormap: str, debug: bool,
          listening: Callable[[str], None]) -> None:
    """Serve the app until SIGINT or SIGTERM. ``listening`` is called with the URL once the port is bound.
    Raises OSError when the address cannot be bound."""
    import textual_serve.server
    from aiohttp import web
    from textual_serve.app_service import AppService
    from textual_serve.server import Server

    running: set[AppService] = set()

    class _App(AppService):
        """A tab's app that the server can stop, and that is reaped when stopped (textual-serve leaves the
        process to the event loop, which may close first: a warning, or a process outliving the server)."""

        async def start(self, width: int, height: int) -> None:
            await super().start(width, height)
            running.add(self)

        async def stop(self) -> None:
            await super().stop()  # asks the app to quit, waits for its output to end
            if self._process is not None:
                try:
                    await asyncio.wait_for(self._process.wait(), APP_QUIT_SECONDS)
                except asyncio.TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        self._process.kill()
                    await self._process.wait()
            running.discard(self)

    textual_serve.server.AppService = _App  # the class its websocket handler instantiates (this process serves)

    class _Server(Server):
        async def on_startup(self, app) -> None:  # textual-serve's banner: the URL is said once bound, below
            pass

        async def on_shutdown(self, app) -> None:  # before the open tabs' handlers are cancelled
            await asyncio.gather(*(service.stop() for service in list(running)), return_exceptions=True)

        async def handle_websocket(self, request):
            if not tab_allowed(request.headers.get("Origin"), request.host, loopback_only=host in LOOPBACK):
                raise web.HTTPForbidden(text="attr-tui: a page of another site may not open this app\n")
            return await super().handle_websocket(request)

        async def handle_index(self, request):
            # The page's websocket URL from the address the browser used (an SSH tunnel's local port, a host
            # name), not from the bind address; the template escapes it.
            self.public_url = f"{request.scheme}://{request.host}"
            return await super().handle_index(request)

    server = _Server(app_command(store, color, colormap, debug), host=host, port=port,
                     title=f"attr-tui {os.path.basename(store)}")
    if debug:
        server.initialize_logging()
    loop = asyncio.new_event_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.request_exit)
    url_host = f"[{host}]" if ":" in host else host
    try:
        # _make_app is textual-serve's app factory (pinned version); run_app is Server.serve's call, our banner
        web.run_app(server._make_app(), host=host, port=port, handle_signals=False, loop=loop,
                    print=lambda *_: listening(f"http://{url_host}:{port}"), shutdown_timeout=5)
    finally:
        loop.close()
