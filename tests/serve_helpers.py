"""Helpers of the `attr-tui --serve` tests: a free loopback port, the server's app processes (from /proc) and a
websocket handshake as a browser page sends it. Traffic goes to loopback addresses only."""

from __future__ import annotations

import base64
import http.client
import os
import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc), zombies included: a process not reaped yet is still there."""
    kids, todo = [], [pid]
    while todo:
        p = todo.pop()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == p:
                    kids.append(int(entry.name))
                    todo.append(int(entry.name))
    return kids


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def handshake(port: int, origin: str | None, host: str, *, address: str = "127.0.0.1", path: str = "/ws",
              headers: dict[str, str] | None = None, with_body: bool = False) -> int | tuple[int, str]:
    """The status (and with_body, the body) of a websocket handshake to the server's ``path`` as a browser page of
    ``origin`` sends it (the connection is closed at once: a 101's app is reaped then)."""
    assert address.startswith("127.") or address == "::1"  # loopback only
    c = http.client.HTTPConnection(address, port, timeout=10)
    try:
        c.request("GET", path, headers={"Host": host, **({"Origin": origin} if origin else {}),
                                        "Connection": "Upgrade", "Upgrade": "websocket",
                                        "Sec-WebSocket-Version": "13",
                                        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
                                        **(headers or {})})
        r = c.getresponse()
        return (r.status, r.read().decode() if r.status != 101 else "") if with_body else r.status
    finally:
        c.close()
