"""``attr-tui STORE --serve`` without a browser: who may open a tab (a page of another site never; off loopback only
with the token the server printed), how many tabs' apps run at once, that a closed tab's app is reaped within 5 s
whatever its state, and that SIGTERM stops the server within 5 s. All traffic goes to loopback addresses."""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from serve_helpers import alive, children, free_port, handshake
from synthetic import make_store

pytest.importorskip("textual_serve", reason="--serve needs textual-serve (pip install -e .)")
aiohttp = pytest.importorskip("aiohttp")

ROOT = Path(__file__).resolve().parents[1]
REAP_SECONDS = 5  # a closed tab's app is gone this long after, and SIGTERM has stopped the server


class Served:
    """A running ``attr-tui STORE --serve`` and the line it printed when it started listening."""

    def __init__(self, store: Path, *args: str):
        self.store, self.port = store, free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "tui.cli", str(store), "--serve", "--port",
                                      str(self.port), *args], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        ready, _, _ = select.select([self.proc.stderr], [], [], 60)
        self.line = self.proc.stderr.readline() if ready else ""
        assert self.line.startswith("attr-tui: serving "), self.line

    def apps(self) -> list[int]:
        return children(self.proc.pid)

    def close(self) -> None:
        left = self.apps()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=30)
        for pid in left:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s.h5"
    make_store(str(path), n_examples=3, L=3, seed=1)
    return path


@pytest.fixture
def serve(store):
    started: list[Served] = []

    def start(*args: str) -> Served:
        started.append(Served(store, *args))
        return started[-1]

    yield start
    for s in started:
        s.close()


def wait_until(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict]:
    assert url.startswith(("http://127.", "http://[::1]"))  # loopback only
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), dict(err.headers)


def test_a_page_of_another_site_is_refused_on_any_loopback_bind(serve):
    """127.0.0.2 is loopback as 127.0.0.1 is: a site that points its name at it (DNS rebinding) gets no app."""
    s = serve("--host", "127.0.0.2")
    p = s.port
    rebinding = "attr-tui: this server answers to a loopback name only, such as 127.0.0.1 or localhost\n"
    for origin, host, text in ((f"http://evil.example:{p}", f"evil.example:{p}", rebinding),
                               ("http://evil.example", f"127.0.0.2:{p}",
                                "attr-tui: a page of another site may not open this app\n"),
                               (None, f"evil.example:{p}", rebinding)):
        assert handshake(p, origin, host, address="127.0.0.2", with_body=True) == (403, text), (origin, host)
    assert get(f"http://127.0.0.2:{p}/", {"Host": f"evil.example:{p}"})[0] == 403  # not even the page
    assert s.apps() == []  # no app was started for them
    assert s.line == f"attr-tui: serving {s.store} on http://127.0.0.2:{p} to at most 4 tabs at once " \
                     "(Ctrl-C stops it)\n"
    status, page, _ = get(f"http://127.0.0.2:{p}/")
    assert status == 200 and f'data-session-websocket-url="ws://127.0.0.2:{p}/ws"' in page
    assert handshake(p, f"http://127.0.0.2:{p}", f"127.0.0.2:{p}", address="127.0.0.2") == 101  # its own page
    assert handshake(p, f"http://localhost:{p}", f"localhost:{p}", address="127.0.0.2") == 101  # via a tunnel


def test_off_loopback_a_tab_needs_the_printed_token(serve):
    """Bound to 0.0.0.0 (reached here through 127.0.0.1 only), the server says its token in the URL it prints; the
    page is served for the token in its URL and sets it as a cookie, which the page's websocket sends."""
    s = serve("--host", "0.0.0.0")
    p = s.port
    m = re.fullmatch(rf"attr-tui: serving \S+ on http://0\.0\.0\.0:{p}/\?token=([A-Za-z0-9_-]{{43}}) to at most 4 "
                     r"tabs at once, only with this token \(Ctrl-C stops it\)\n", s.line)
    assert m, s.line
    token = m[1]
    own, host = f"http://127.0.0.1:{p}", f"127.0.0.1:{p}"
    cookie = f"attr-tui-token-{p}"
    wrong = token[:-1] + ("A" if token[-1] != "A" else "B")
    for query in ("", "?token=", f"?token={wrong}", "?token=%C3%A9", f"?token={token}x"):
        status, text, _ = get(f"{own}/{query}")
        assert status == 403 and text == "attr-tui: this server needs the token in the URL it printed when it " \
                                         "started\n", query
    assert get(f"{own}/static/js/textual.js")[0] == 403
    status, page, headers = get(f"{own}/?token={token}")
    assert status == 200 and f'data-session-websocket-url="ws://{host}/ws"' in page
    assert re.fullmatch(rf"{cookie}={token}; HttpOnly; Path=/; SameSite=Strict", headers["Set-Cookie"]), headers
    assert get(f"{own}/static/js/textual.js", {"Cookie": f"{cookie}={token}"})[0] == 200  # the page's own scripts
    for headers in ({}, {"Cookie": f"{cookie}={wrong}"}, {"Cookie": f"attr-tui-token-{p + 1}={token}"}):
        assert handshake(p, own, host, headers=headers) == 403, headers
    # a site that points its name at this machine: Origin and Host agree, but it has no token
    assert handshake(p, f"http://evil.example:{p}", f"evil.example:{p}") == 403
    # a page of another site, even with the token's cookie
    assert handshake(p, "http://evil.example", host, headers={"Cookie": f"{cookie}={token}"}) == 403
    assert s.apps() == []
    assert handshake(p, own, host, headers={"Cookie": f"{cookie}={token}"}) == 101
    assert handshake(p, own, host, path=f"/ws?token={token}") == 101  # a client that is no browser page


async def _open_tabs(session, port: int, n: int, hold: bool = True,
                     sample=lambda: None) -> tuple[list, list[int]]:
    """Open ``n`` websockets at once to 127.0.0.1:``port`` as the server's own page does; each is closed as soon as
    it is open unless ``hold``. Returns the open ones (when held) and the statuses of the refused ones."""
    url = f"http://127.0.0.1:{port}/ws?width=80&height=24"
    held, refused = [], []

    async def one():
        try:
            ws = await session.ws_connect(url, origin=f"http://127.0.0.1:{port}", timeout=aiohttp.ClientWSTimeout(
                ws_close=1), autoping=False)
        except aiohttp.WSServerHandshakeError as err:
            refused.append(err.status)
            return
        sample()
        if hold:
            held.append(ws)
        else:
            await ws.close()

    await asyncio.wait_for(asyncio.gather(*(one() for _ in range(n))), 60)
    return held, refused


async def _first_output(ws) -> None:
    """Wait for the app's first screen: it runs (not still starting)."""
    while True:
        msg = await asyncio.wait_for(ws.receive(), 60)
        if msg.type == aiohttp.WSMsgType.BINARY and len(msg.data) > 10:
            return
        assert msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), msg


def _described(pid: int) -> str:
    """pid, state and the end of its command line (which store, which script), for a failure's message."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} {state} {cmd[-80:]}"


class Sampler:
    """The most app processes seen at once, from a thread that looks every 50 ms."""

    def __init__(self, served: Served):
        self.served, self.most, self.stop = served, 0, threading.Event()
        self.seen: list[str] = []  # the processes of the most seen at once: a failure says what they were
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def look(self) -> None:
        # Those of the scan that are still there after it existed together (the scan is not one instant: an app
        # reaped early in it and the next one, started late in it, would count as two)
        at_once = [p for p in self.served.apps() if Path(f"/proc/{p}").exists()]
        if len(at_once) > self.most:
            self.most, self.seen = len(at_once), [_described(p) for p in at_once]

    def run(self) -> None:
        while not self.stop.wait(0.05):
            self.look()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def test_tabs_are_capped_and_a_closed_tabs_app_is_reaped_whatever_its_state(serve):
    """30 websockets opened and closed at once: at most the default cap (4) of apps at any time, every one reaped
    within 5 s of the last close; then tabs held open until their apps run, one of those frozen (SIGSTOP: it
    neither quits when asked nor ends its output), closed: all reaped within 5 s."""
    s = serve()
    async def opened_and_closed(sample):
        async with aiohttp.ClientSession() as session:
            return (await _open_tabs(session, s.port, 30, False, sample))[1]

    with Sampler(s) as sampler:
        refused = asyncio.run(opened_and_closed(sampler.look))
        closed = time.monotonic()
        assert wait_until(lambda: not s.apps(), REAP_SECONDS), s.apps()
        assert time.monotonic() - closed < REAP_SECONDS
        assert sampler.most <= 4, sampler.seen
        assert 4 <= 30 - len(refused) and set(refused) <= {503}, refused

    async def held_then_closed():
        async with aiohttp.ClientSession() as session:
            held, refused = await _open_tabs(session, s.port, 6)
            assert len(held) == 4 and refused == [503, 503], refused
            assert wait_until(lambda: len(s.apps()) == 4, 10)  # each is started once its socket is open
            await asyncio.gather(*(_first_output(ws) for ws in held))
            os.kill(s.apps()[0], signal.SIGSTOP)
            await asyncio.gather(*(ws.close() for ws in held))

    with Sampler(s) as sampler:
        asyncio.run(held_then_closed())
        closed = time.monotonic()
        assert wait_until(lambda: not s.apps(), REAP_SECONDS), s.apps()
        assert time.monotonic() - closed < REAP_SECONDS and sampler.most <= 4
    assert s.proc.poll() is None  # the server serves on
    status, text, _ = get(f"http://127.0.0.1:{s.port}/")
    assert status == 200


def test_max_sessions_caps_the_tabs(serve):
    s = serve("--max-sessions", "1")
    assert " to at most 1 tab at once (Ctrl-C stops it)\n" in s.line, s.line

    async def two_then_one():
        async with aiohttp.ClientSession() as session:
            held, refused = await _open_tabs(session, s.port, 2)
            assert len(held) == 1 and refused == [503] and wait_until(lambda: len(s.apps()) == 1, 10)
            host = f"127.0.0.1:{s.port}"
            assert await asyncio.to_thread(handshake, s.port, f"http://{host}", host, with_body=True) == \
                (503, "attr-tui: 1 tab open already (--max-sessions 1): close one, then reload this page\n")
            await held[0].close()  # a tab reloaded: its app is reaped, the next one gets in
            again, refused = await _open_tabs(session, s.port, 1)
            assert len(again) == 1 and refused == [] and wait_until(lambda: len(s.apps()) == 1, 10)
            await again[0].close()

    asyncio.run(two_then_one())
    assert wait_until(lambda: not s.apps(), REAP_SECONDS)
    status, text, _ = get(f"http://127.0.0.1:{s.port}/")
    assert status == 200


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_server_within_5_s_with_apps_in_any_state(serve, sig):
    """Tabs open: one app running, one frozen (SIGSTOP), two still starting. SIGTERM (or SIGINT, Ctrl-C) ends the
    server, rc 0, within 5 s, no app left."""
    s = serve()

    async def tabs_then_signal():
        async with aiohttp.ClientSession() as session:
            held, _ = await _open_tabs(session, s.port, 2)
            await asyncio.gather(*(_first_output(ws) for ws in held))
            os.kill(s.apps()[0], signal.SIGSTOP)
            more, _ = await _open_tabs(session, s.port, 2)
            assert wait_until(lambda: len(s.apps()) == 4, 10)
            apps = s.apps()
            os.kill(s.proc.pid, sig)
            sent = time.monotonic()
            rc = await asyncio.to_thread(s.proc.wait, 30)
            return rc, time.monotonic() - sent, apps

    rc, took, apps = asyncio.run(tabs_then_signal())
    _, err = s.proc.communicate(timeout=10)
    assert rc == 0 and took < REAP_SECONDS, (rc, took, err)
    assert "Traceback" not in err, err
    assert [p for p in apps if alive(p)] == []


def test_only_the_servers_own_page_opens_an_app():
    from tui.serve import tab_allowed

    assert tab_allowed(None, "127.0.0.1:8000")  # no Origin: no browser page
    for origin, host in (("http://127.0.0.1:8000", "127.0.0.1:8000"), ("http://localhost:9000", "localhost:9000"),
                         ("http://[::1]:8000", "[::1]:8000"), ("http://box.lan:8000", "box.lan:8000")):
        assert tab_allowed(origin, host), origin
    for origin, host in (("http://evil.example", "127.0.0.1:8000"), ("null", "127.0.0.1:8000"),
                         ("http://127.0.0.1:8001", "127.0.0.1:8000"), ("http://evil.example", "box.lan:8000")):
        assert not tab_allowed(origin, host), origin


def test_which_names_and_binds_are_loopback():
    """Loopback names only reach this machine; a bind is loopback when every address it takes is (no DNS asked)."""
    from tui.serve import host_name, loopback_bind, loopback_name

    assert [host_name(h) for h in ("127.0.0.1:8000", "[::1]:8000", "LocalHost", "[::1", "a.b:x")] == \
        ["127.0.0.1", "::1", "localhost", None, "a.b"]
    for name in ("127.0.0.1", "127.0.0.2", "127.255.0.9", "::1", "localhost", "app.localhost"):
        assert loopback_name(name), name
    for name in (None, "", "0.0.0.0", "::", "10.0.0.1", "evil.example", "localhost.evil.example", "128.0.0.1"):
        assert not loopback_name(name), name
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert loopback_bind(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1"):
        assert not loopback_bind(host), host


def test_tokens_are_compared_whole():
    from tui.serve import token_matches

    assert token_matches("abc-_9", "abc-_9")
    for given in (None, "", "abc-_", "abc-_90", "ABC-_9", "é", "abc-_9\x00"):
        assert not token_matches(given, "abc-_9"), given


def test_the_page_focuses_its_terminal_on_load(serve):
    """Issue 38, item 11: keys did nothing until the terminal was clicked. The page focuses the terminal's input
    (xterm.js's helper textarea) once xterm has made it, and again when the window gets the focus back; it needs no
    click (test_tui_serve.py types into the page in Chromium without one)."""
    from tui.serve import FOCUS_SCRIPT

    s = serve()
    status, page, _ = get(f"http://127.0.0.1:{s.port}/")
    assert status == 200
    body = page.split("<body", 1)[1]
    assert body.count(FOCUS_SCRIPT) == 1 and body.index(FOCUS_SCRIPT) > body.index('id="terminal"')
    assert ".xterm-helper-textarea" in FOCUS_SCRIPT and ".focus(" in FOCUS_SCRIPT
    assert "MutationObserver" in FOCUS_SCRIPT and "addEventListener(\"focus\"" in FOCUS_SCRIPT
    assert s.apps() == []  # the page alone starts no app
