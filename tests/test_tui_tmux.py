"""attr-tui in a real terminal multiplexer (tmux): it draws, and q and Ctrl-C each end it with exit status 0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from synthetic import make_store

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux installed")
ROOT = Path(__file__).resolve().parents[1]


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=20).stdout


def _wait(predicate, seconds: float = 60.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("key", ["q", "C-c"])
def test_quits_in_tmux(tmp_path, key):
    store = tmp_path / "s.h5"
    make_store(str(store), n_examples=4)
    sock = f"attr-tui-test-{uuid.uuid4().hex[:8]}"
    env = f"env PYTHONPATH={ROOT} TERM=xterm-256color"
    status = tmp_path / "status"
    cmd = f"sh -c '{env} {sys.executable} -m tui.cli {store}; echo $? > {status}'"
    try:
        _tmux(sock, "-f", os.devnull, "new-session", "-d", "-x", "80", "-y", "24", "-c", str(ROOT), cmd)
        assert _wait(lambda: "ex0" in _tmux(sock, "capture-pane", "-p")), _tmux(sock, "capture-pane", "-p")
        time.sleep(0.5)
        _tmux(sock, "send-keys", key)
        assert _wait(status.exists, 20), _tmux(sock, "capture-pane", "-p")
        assert _wait(lambda: status.read_text().strip() != "", 5) and status.read_text().strip() == "0"
    finally:
        _tmux(sock, "kill-server")
