"""``attr-tui STORE --serve``: the same app in a browser, through textual-serve.

The server listens on ``host:port`` (127.0.0.1 unless the user says otherwise: the app reads the store for anyone
who reaches the port; off loopback only with the token in the URL it prints) and starts one ``attr-tui STORE``
process per browser tab, at most ``max_sessions`` at once, which textual-serve's web driver connects to the page
over a websocket. A tab's app is reaped within 5 s of its tab closing; SIGINT/SIGTERM stop the server, and every
tab's app, within 5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hmac
import ipaddress
import logging
import os
import secrets
import shlex
import signal
import socket
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

import textual_serve.server
from aiohttp import web
from textual_serve.app_service import AppService
from textual_serve.server import Server

# A closed tab's app is reaped within 5 s (issue 34): asked to quit, it is killed if it has not this long after.
APP_QUIT_SECONDS = 2
SLOT_WAIT_SECONDS = APP_QUIT_SECONDS + 1  # a new tab waits this long for a closing tab's app to free its place
CLOSE_SECONDS = 1  # at shutdown, a tab's browser has this long to answer the close of its websocket


def host_name(host: str) -> str | None:
    """The name (or address) in a Host header or an Origin's netloc, lower-case, without port or brackets."""
    try:
        return urlsplit("//" + host).hostname
    except ValueError:  # e.g. "[::1"
        return None


def loopback_name(name: str | None) -> bool:
    """Whether ``name`` can only mean this machine: an address of 127.0.0.0/8 or ::1, or localhost (RFC 6761)."""
    if name is None:
        return False
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def loopback_bind(host: str) -> bool:
    """Whether every address the server binds for ``host`` is a loopback one (0.0.0.0 and :: are every address)."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):  # binding it fails too, and says so
        return False
    return bool(addresses) and all(loopback_name(a) for a in addresses)


def tab_allowed(origin: str | None, host: str) -> bool:
    """Whether a websocket may start an app. A browser names the page that opens one (Origin): any web site the
    user visits could otherwise open ws://127.0.0.1:PORT/ws and read the store through the app, so the page must be
    this server's own (same host and port as the request's Host). A client without Origin is no browser page. That
    the Host is this server's (DNS rebinding: a site pointing its own name at the server) is the guard's check."""
    return origin is None or urlsplit(origin).netloc == host


def token_matches(given: str | None, token: str) -> bool:
    """Whether ``given`` is the server's token, in a time that does not tell how much of it matched."""
    return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), token.encode())


def tab_count(n: int) -> str:
    return f"{n} tab{'s' if n != 1 else ''}"


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


# The apps a websocket's handler made (textual-serve makes them inside its handler, in the handler's task)
SOCKET_APPS: contextvars.ContextVar[list] = contextvars.ContextVar("socket_apps")


class TabApp(AppService):
    """A tab's app, reaped within APP_QUIT_SECONDS (and the moment a kill takes) of being stopped, whatever its
    state: textual-serve's stop waits without end for an app that does not quit (one still starting, or stuck
    writing to a closed tab) and leaves the process to the event loop, which may close first."""

    def __init__(self, *args, tabs: set[TabApp], **kwargs):
        super().__init__(*args, **kwargs)
        self._tabs = tabs
        self._reaping: asyncio.Future | None = None
        made = SOCKET_APPS.get(None)
        if made is not None:  # its socket's handler frees the tab's place once this app is reaped
            made.append(self)

    async def start(self, width: int, height: int) -> None:
        await super().start(width, height)
        self._tabs.add(self)

    async def _open_app_process(self, width: int = 80, height: int = 24):
        # A handler cancelled while the process is being made would leave it unknown to stop(): running, unreaped,
        # its tab's place already free. The making finishes, so that stop() finds the process and reaps it.
        # A second cancellation while it finishes must not cancel the making either (the process would be made
        # and never known): asyncio.wait never cancels what it waits for.
        opening = asyncio.ensure_future(super()._open_app_process(width, height))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            while not opening.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({opening})
            raise

    async def stop(self) -> None:
        if self._process is None:
            return
        if self._reaping is None:  # stopped by its tab's handler and by the shutdown: one reaping, never cancelled
            self._reaping = asyncio.ensure_future(self._reap())
        await asyncio.shield(self._reaping)

    async def on_data(self, payload: bytes) -> None:
        # A closed tab's app may still write: its output is read on (and dropped), or the app would block writing
        # and never quit, and its pipe would never end (textual-serve stops reading at the first failed send).
        with contextlib.suppress(ConnectionResetError):
            await super().on_data(payload)

    async def _reap(self) -> None:
        process = self._process
        # Asks the app to quit and waits for its output to end. Not under a timeout: its task swallows a
        # cancellation and would hold the timeout up until the app quits.
        asking = asyncio.ensure_future(super().stop())
        try:
            await asyncio.wait_for(process.wait(), APP_QUIT_SECONDS)
        except asyncio.TimeoutError:
            pass
        finally:  # killed also when the reaping is cancelled (the event loop closing): no app outlives the server
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            self._tabs.discard(self)
        await process.wait()
        await asking  # its output ends with it


# The page's terminal takes the keys from the start: its input (xterm.js's helper textarea, made by the page's
# script) is focused as soon as it exists, and once more when the app's first bytes arrive (the page tells the app
# of a focus over the websocket, which is open only then: Textual shows the footer's keys only to a focused
# terminal), and whenever the window gets the focus back; no click needed.
FOCUS_SCRIPT = """<script>
(function () {
  function input() { return document.querySelector(".xterm-helper-textarea"); }
  function focus() { var i = input(); if (i) { i.focus({preventScroll: true}); } return !!i; }
  function refocus() { var i = input(); if (i) { i.blur(); i.focus({preventScroll: true}); } }
  if (!focus()) {
    var made = new MutationObserver(function () { if (focus()) { made.disconnect(); } });
    made.observe(document.body, {childList: true, subtree: true});
  }
  var started = new MutationObserver(function () {
    if (document.body.classList.contains("-first-byte")) { started.disconnect(); refocus(); }
  });
  started.observe(document.body, {attributes: true, attributeFilter: ["class"]});
  window.addEventListener("focus", focus);
})();
</script>
"""


class TabServer(Server):
    """textual-serve's server with guards: every request on a loopback bind must name a loopback host (or a site
    that points its own name at this machine, DNS rebinding, would reach it); off loopback, every request must
    carry the token (``?token=`` or the cookie the page sets), as the address is open to anyone who reaches the
    port; a websocket must come from the server's own page; at most ``max_sessions`` tabs' apps run at once."""

    def __init__(self, command: str, *, host: str, port: int, title: str, max_sessions: int, token: str | None):
        super().__init__(command, host=host, port=port, title=title)
        self.max_sessions, self.token = max_sessions, token
        self.cookie = f"attr-tui-token-{port}"  # a browser keeps cookies per host, not per port
        self.tabs: set[TabApp] = set()
        self.places = asyncio.Semaphore(max_sessions)  # taken until the tab's app is reaped
        self.exiting = False

    def request_exit(self) -> None:
        if not self.exiting:  # a second Ctrl-C would break off the shutdown that reaps the apps
            self.exiting = True
            super().request_exit()

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self.guard)
        return app

    @web.middleware
    async def guard(self, request: web.Request, handler):
        if self.token is None:
            if not loopback_name(host_name(request.host)):
                raise web.HTTPForbidden(text="attr-tui: this server answers to a loopback name only, such as "
                                             "127.0.0.1 or localhost\n")
        elif not (token_matches(request.query.get("token"), self.token)
                  or token_matches(request.cookies.get(self.cookie), self.token)):
            raise web.HTTPForbidden(text="attr-tui: this server needs the token in the URL it printed when it "
                                         "started\n")
        return await handler(request)

    async def on_startup(self, app) -> None:  # textual-serve's banner: the URL is said once bound, in serve()
        pass

    async def on_shutdown(self, app) -> None:  # before the open tabs' handlers are cancelled
        async def close(tab: TabApp) -> None:
            with contextlib.suppress(asyncio.TimeoutError):  # a browser that does not answer: its socket is cut
                await asyncio.wait_for(tab.remote_close(), CLOSE_SECONDS)

        tabs = list(self.tabs)
        await asyncio.gather(*(tab.stop() for tab in tabs), *(close(tab) for tab in tabs), return_exceptions=True)

    async def handle_websocket(self, request):
        if not tab_allowed(request.headers.get("Origin"), request.host):
            raise web.HTTPForbidden(text="attr-tui: a page of another site may not open this app\n")
        try:  # a reloaded tab's new socket may come before its old app is reaped: it waits for the place
            await asyncio.wait_for(self.places.acquire(), SLOT_WAIT_SECONDS)
        except asyncio.TimeoutError:
            raise web.HTTPServiceUnavailable(text=f"attr-tui: {tab_count(self.max_sessions)} open already "
                                                  f"(--max-sessions {self.max_sessions}): close one, then reload "
                                                  "this page\n")
        made: list[TabApp] = []
        SOCKET_APPS.set(made)  # this handler's task only
        try:
            return await super().handle_websocket(request)  # returns once the tab's app is reaped
        finally:
            # A handler cancelled by its closing socket leaves while its app may still be quitting: the place is
            # freed when the app is reaped, so at most max_sessions apps ever exist at once.
            asyncio.ensure_future(self._free_place(made))

    async def _free_place(self, made: list[TabApp]) -> None:
        try:
            await asyncio.gather(*(tab.stop() for tab in made), return_exceptions=True)
        finally:
            self.places.release()

    async def handle_index(self, request):
        # The page's websocket URL from the address the browser used (an SSH tunnel's local port, a host
        # name), not from the bind address; the template escapes it.
        self.public_url = f"{request.scheme}://{request.host}"
        response = await super().handle_index(request)
        response.text = response.text.replace("</body>", FOCUS_SCRIPT + "</body>", 1)
        if self.token is not None:  # sent back by the page's scripts and websocket, never readable by a script
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict")
        return response


def serve(store: str, host: str, port: int, *, color: str, colormap: str, debug: bool, max_sessions: int,
          listening: Callable[[str, bool], None]) -> None:
    """Serve the app until SIGINT or SIGTERM. ``listening`` is called once the port is bound, with the URL to open
    and whether it carries a token (the bind is not loopback only). Raises OSError when the address cannot be
    bound."""
    token = None if loopback_bind(host) else secrets.token_urlsafe(32)
    server = TabServer(app_command(store, color, colormap, debug), host=host, port=port,
                       title=f"attr-tui {os.path.basename(store)}", max_sessions=max_sessions, token=token)
    # the class textual-serve's websocket handler instantiates (this process runs one server)
    textual_serve.server.AppService = functools.partial(TabApp, tabs=server.tabs)
    if debug:
        server.initialize_logging()
    else:  # its log says "Application failed to start" for a tab closed while its app was starting (reaped)
        logging.getLogger("textual-serve").addHandler(logging.NullHandler())
    loop = asyncio.new_event_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.request_exit)
    url_host = f"[{host}]" if ":" in host else host
    url = f"http://{url_host}:{port}" + (f"/?token={token}" if token else "")
    try:
        # _make_app is textual-serve's app factory (pinned version); run_app is Server.serve's call, our banner
        web.run_app(server._make_app(), host=host, port=port, handle_signals=False, loop=loop,
                    print=lambda *_: listening(url, token is not None), shutdown_timeout=CLOSE_SECONDS)
    finally:
        loop.close()
