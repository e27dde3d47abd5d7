"""``attr-tui STORE --serve``: the same app in a browser, through textual-serve.

The server listens on ``host:port`` (127.0.0.1 unless the user says otherwise: the app reads the store for anyone
who reaches the port) and starts one ``attr-tui STORE`` process per browser tab, which textual-serve's web driver
connects to the page over a websocket. SIGINT/SIGTERM stop the server, which closes every tab's app.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
from collections.abc import Callable


def app_command(store: str, color: str, colormap: str) -> str:
    """The shell command that runs the app of one tab: this interpreter, the ``tui`` package this process imported
    (not whichever one the working directory holds), the store by its absolute path."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"import sys; sys.path.insert(0, {root!r}); from tui.cli import main; main()"
    args = [sys.executable, "-c", code, os.path.abspath(store), "--color", color, "--colormap", colormap]
    return "exec " + shlex.join(args)  # exec: the app is the shell's process, so stopping it leaves no shell behind


def serve(store: str, host: str, port: int, *, color: str, colormap: str, debug: bool,
          listening: Callable[[str], None]) -> None:
    """Serve the app until SIGINT or SIGTERM. ``listening`` is called with the URL once the port is bound.
    Raises OSError when the address cannot be bound."""
    from aiohttp import web
    from textual_serve.server import Server

    class _Server(Server):
        async def on_startup(self, app) -> None:  # textual-serve's banner: the URL is said once bound, below
            pass

        async def handle_index(self, request):
            # The page's websocket URL from the address the browser used (an SSH tunnel's local port, a host
            # name), not from the bind address; the template escapes it.
            self.public_url = f"{request.scheme}://{request.host}"
            return await super().handle_index(request)

    server = _Server(app_command(store, color, colormap), host=host, port=port,
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
