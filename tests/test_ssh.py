"""attr-tui over a real SSH connection: an asyncssh server on localhost runs it in a pseudo-terminal, the system
``ssh`` client connects with TERM=xterm-256color from a pseudo-terminal of 80x24, the test types keys and reads the
screen back through a terminal emulator (pyte)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import shutil
import signal
import struct
import sys
import termios
import time
from pathlib import Path

import pytest
from synthetic import make_store

asyncssh = pytest.importorskip("asyncssh", reason="the SSH test needs asyncssh (pip install 'attrscope[test]')")
pyte = pytest.importorskip("pyte", reason="the SSH test needs pyte (pip install 'attrscope[test]')")
pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client installed")

ROOT = Path(__file__).resolve().parents[1]
COLS, ROWS = 80, 24


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


async def _run_in_pty(process) -> None:
    """The server side: the requested command in a pseudo-terminal of the client's size and TERM."""
    cols, rows, *_ = process.get_terminal_size() or (COLS, ROWS)
    term = process.get_terminal_type() or "dumb"
    master, slave = os.openpty()
    _set_size(slave, rows or ROWS, cols or COLS)
    env = dict(os.environ, TERM=term, PYTHONPATH=str(ROOT), COLUMNS=str(cols), LINES=str(rows))
    env.pop("COLORTERM", None)  # sshd forwards none of it
    env.pop("NO_COLOR", None)
    child = await asyncio.create_subprocess_exec("/bin/sh", "-c", process.command, stdin=slave, stdout=slave,
                                                 stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def readable() -> None:
        try:
            data = os.read(master, 65536)
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(master)
            done.set()
            return
        process.stdout.write(data.decode("utf-8", "replace"))

    loop.add_reader(master, readable)

    async def pump_stdin() -> None:
        try:
            while True:
                data = await process.stdin.read(1024)
                if not data:
                    break
                os.write(master, data.encode())
        except (OSError, asyncssh.Error):
            pass

    feeder = asyncio.ensure_future(pump_stdin())
    rc = await child.wait()
    await asyncio.wait_for(done.wait(), 5)
    feeder.cancel()
    os.close(master)
    process.exit(rc)


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return True


def test_attr_tui_over_ssh(tmp_path):
    store = tmp_path / "remote.h5"
    make_store(str(store), n_examples=6, L=3, seed=4)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = tmp_path / "id_ed25519"
    client_key.write_private_key(str(key_file))
    key_file.chmod(0o600)
    authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())

    async def main() -> tuple[str, str, int]:
        server = await asyncssh.create_server(_Server, "127.0.0.1", 0, server_host_keys=[host_key],
                                              authorized_client_keys=authorized, process_factory=_run_in_pty,
                                              encoding="utf-8", line_editor=False)  # raw keys to the app
        port = server.sockets[0].getsockname()[1]
        command = f"exec {sys.executable} -m tui.cli {store}"
        pid, fd = pty.fork()
        if pid == 0:  # the client, in a local pseudo-terminal as a user's
            os.environ["TERM"] = "xterm-256color"
            os.execvp("ssh", ["ssh", "-tt", "-p", str(port), "-i", str(key_file), "-o", "StrictHostKeyChecking=no",
                              "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o",
                              "BatchMode=yes", "tester@127.0.0.1", command])
        _set_size(fd, ROWS, COLS)
        screen = pyte.Screen(COLS, ROWS)
        stream = pyte.ByteStream(screen)
        raw = bytearray()
        loop = asyncio.get_running_loop()

        async def read_until(pred, timeout: float) -> str:
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                try:
                    data = await asyncio.wait_for(loop.run_in_executor(None, os.read, fd, 65536), 0.5)
                except asyncio.TimeoutError:
                    data = b""
                except OSError:
                    break
                if data:
                    raw.extend(data)
                    stream.feed(data)
                text = "\n".join(screen.display)
                if pred(text):
                    return text
            return "\n".join(screen.display)

        try:
            # the header line comes a frame before the tokens: wait for the token view's last token too
            first = await read_until(lambda t: "1/6" in t and "examples" in t and "[SEP]" in t, 60)
            os.write(fd, b"j")
            second = await read_until(lambda t: "2/6" in t, 20)
            os.write(fd, b"q")
            end = time.monotonic() + 20
            status = None
            while time.monotonic() < end:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                try:
                    await asyncio.wait_for(loop.run_in_executor(None, os.read, fd, 65536), 0.5)
                except (asyncio.TimeoutError, OSError):
                    pass
            else:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            rc = os.waitstatus_to_exitcode(status) if status is not None else -1
        finally:
            server.close()
            os.close(fd)
        return first, second, rc, bytes(raw)

    first, second, rc, raw = asyncio.run(main())
    from store import open_store

    with open_store(store) as s:
        ids, tokens = s.ids(), s[0].tokens
    assert ids[0] in first and "1/6" in first and "6 examples" in first, first
    assert all(t in first for t in tokens if t.isascii() and "[" not in t), first
    assert "2/6" in second and ids[1] in second, second
    assert rc == 0, (rc, second)
    # TERM=xterm-256color without COLORTERM, as sshd passes it: 256-colour backgrounds, no truecolor ones
    assert b"48;5;" in raw and b"48;2;" not in raw
