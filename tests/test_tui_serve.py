"""``attr-tui STORE --serve`` in a real headless Chromium (Debian's chromium and chromium-driver, driven by selenium):
the page loads, the first example's text is drawn, a key typed into the page moves to the next example, and
stopping the server leaves no app process behind. The bytes the page's terminal (xterm.js) is given are collected
by a hook in the page and read back through a terminal emulator (pyte), the way tests/test_ssh.py reads ssh's."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from serve_helpers import alive, children, free_port, handshake
from synthetic import make_store

pyte = pytest.importorskip("pyte", reason="the browser test needs pyte (pip install 'attrscope[test]')")
webdriver = pytest.importorskip("selenium.webdriver", reason="the browser test needs selenium (pip install "
                                "'attrscope[test]')")
pytest.importorskip("textual_serve", reason="--serve needs textual-serve (pip install -e .)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="no chromium/chromedriver (apt-get install chromium chromium-driver)")

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT = "ATTRSCOPE_SERVE_SCREENSHOT"  # where to keep the page's screenshot (a PNG), if set

# Before the page's own scripts: keep every binary websocket message (the app's output) and the size the page asks.
HOOK = """
window.__out = []; window.__size = null;
const Native = window.WebSocket;
window.WebSocket = function (url, protocols) {
  const ws = new Native(url, protocols);
  const q = new URL(url).searchParams;
  window.__size = [parseInt(q.get('width')), parseInt(q.get('height'))];
  ws.addEventListener('message', (e) => {
    if (typeof e.data !== 'string') {
      let s = ''; for (const b of new Uint8Array(e.data)) s += String.fromCharCode(b);
      window.__out.push(btoa(s));
    }
  });
  const send = ws.send.bind(ws);
  ws.send = (data) => {
    try { const m = JSON.parse(data); if (m[0] === 'resize') window.__size = [m[1].width, m[1].height]; } catch (e) {}
    return send(data);
  };
  return ws;
};
window.WebSocket.prototype = Native.prototype;
"""


class Page:
    """The page's terminal as text: the collected output fed to a pyte screen of the page's size."""

    def __init__(self, driver):
        self.driver = driver
        self.screen = None
        self.stream = None
        self.seen = 0
        self.raw = bytearray()

    def text(self) -> str:
        size, chunks = self.driver.execute_script(f"return [window.__size, window.__out.slice({self.seen})]")
        if self.screen is None and size:
            self.screen = pyte.Screen(*size)
            self.stream = pyte.ByteStream(self.screen)
        elif size and [self.screen.columns, self.screen.lines] != size:
            self.screen.resize(size[1], size[0])
        if self.screen is None:
            return ""
        for chunk in chunks:
            data = base64.b64decode(chunk)
            self.raw.extend(data)
            self.stream.feed(data)
        self.seen += len(chunks)
        return "\n".join(self.screen.display)

    def wait(self, pred, timeout: float) -> str:
        end = time.monotonic() + timeout
        text = ""
        while time.monotonic() < end:
            text = self.text()
            if pred(text):
                return text
            time.sleep(0.2)
        return text


def test_serve_in_headless_chromium(tmp_path):
    """ATTRSCOPE_SERVE_SCREENSHOT=FILE.png keeps the screenshot of the first example."""
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    store = tmp_path / "web <b>.h5"  # the page's title carries the store's name: escaped by the template
    make_store(str(store), n_examples=6, L=3, seed=4)
    port = free_port()
    # its own process group, stopped below as Ctrl-C in a terminal stops one: SIGINT to the whole group
    server = subprocess.Popen([sys.executable, "-m", "tui.cli", str(store), "--serve", "--port", str(port)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,640",
                "--disable-gpu", "--no-first-run"):
        options.add_argument(arg)
    driver = None
    apps: list[int] = []
    try:
        line = server.stderr.readline()  # once listening
        assert line.strip() == f"attr-tui: serving {store} on http://127.0.0.1:{port} to at most 4 tabs at once " \
                               "(Ctrl-C stops it)", line
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": HOOK})
        driver.get(f"http://127.0.0.1:{port}/")
        assert not driver.find_elements("tag name", "b")  # the name's "<b>" is text, not markup
        assert "attr-tui web <b>.h5" in driver.find_element("css selector", ".intro").get_attribute("textContent")
        page = Page(driver)
        from store import open_store

        with open_store(store) as s:
            ids, tokens, n = s.ids(), s[0].tokens, len(s)
        words = [t for t in tokens if t.isascii() and "[" not in t]
        first = page.wait(lambda t: f"1/{n}" in t and all(w in t for w in words) and "[SEP]" in t, 30)
        assert f"1/{n}" in first and ids[0] in first and all(w in first for w in words), first
        # focused on load, without a click (issue 38): Textual shows the footer's keys only then
        assert "q quit" in page.wait(lambda t: "q quit" in t.splitlines()[-1], 15).splitlines()[-1]
        assert driver.execute_script("return document.activeElement.classList.contains('xterm-helper-textarea')")
        apps = children(server.pid)
        assert apps, "no app process for the tab"
        shot = os.environ.get(SCREENSHOT) or str(tmp_path / "page.png")
        assert driver.save_screenshot(shot) and Path(shot).read_bytes().startswith(b"\x89PNG")
        driver.switch_to.active_element.send_keys("j")  # a key typed into the page as it is, nothing clicked
        second = page.wait(lambda t: f"2/{n}" in t and ids[1] in t, 15)
        assert f"2/{n}" in second and ids[1] in second, second
        # the page's own xterm drew it: a non-blank screenshot and the page marked as having received output
        assert "-first-byte" in driver.find_element("tag name", "body").get_attribute("class")
        assert b"\x1b[" in page.raw and b"48;2;" in page.raw  # truecolor backgrounds: the tokens' colours
        # through an SSH tunnel's other local port the page connects back to the address it was loaded from
        index = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"Host": "localhost:9000"})
        with urllib.request.urlopen(index, timeout=10) as r:
            assert 'data-session-websocket-url="ws://localhost:9000/ws"' in r.read().decode()
        # a page of another site (or one that points its name at 127.0.0.1) may not open an app
        for origin, host in (("http://evil.example", f"127.0.0.1:{port}"),
                             (f"http://evil.example:{port}", f"evil.example:{port}")):
            assert handshake(port, origin, host) == 403
        assert children(server.pid) == apps  # no app started for them
    finally:
        os.killpg(server.pid, signal.SIGINT)  # as Ctrl-C in the server's terminal, with the tab still open
        try:
            rc = server.wait(20)
        finally:
            if server.poll() is None:
                server.kill()
            out, err = server.communicate()
            if driver is not None:
                driver.quit()
    assert rc == 0, (rc, err)
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err + out, (out, err)
    time.sleep(0.5)
    left = [p for p in apps if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"app processes left after the server stopped: {left}"


def test_serve_refuses_a_bad_store_before_listening(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tui.cli", str(tmp_path / "none.h5"), "--serve", "--port",
                        str(free_port())], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("attr-tui: error: store ") and "not found" in r.stderr


def test_serve_options_need_serve(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tui.cli", str(tmp_path / "none.h5"), "--port", "8000"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--host, --port and --max-sessions go with --serve" in r.stderr


def test_serve_reports_a_taken_port_in_one_line(tmp_path):
    store = tmp_path / "s.h5"
    make_store(str(store), n_examples=2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "tui.cli", str(store), "--serve", "--port", str(port)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"attr-tui: error: cannot listen on 127.0.0.1:{port}: ")
    assert r.stderr.rstrip().endswith("choose another --port or --host")


def test_a_tabs_app_gets_the_servers_options_and_debug(tmp_path):
    """Each tab runs `attr-tui STORE` with the server's --color, --colormap and, when the server has it, --debug."""
    import shlex

    from tui.serve import app_command

    store = tmp_path / "s.h5"
    for debug in (False, True):
        argv = shlex.split(app_command(str(store), "256", "light", debug))
        assert argv[0] == "exec" and argv[1] == sys.executable and argv[2] == "-c"
        assert argv[4:] == [str(store), "--color", "256", "--colormap", "light"] + (["--debug"] if debug else [])
