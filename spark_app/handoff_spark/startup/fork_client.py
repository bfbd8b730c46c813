"""The `python` Spark's JVM runs for its Python processes, when the driver runs a fork server (`startup.fork_server`).

Why a separate, tiny program: Spark starts each Python process as `<pythonExec> -m <module> …` and talks to it over
its stdin, stdout, stderr and exit status. This program is that `pythonExec`. It asks the fork server to fork a
process that runs `-m <module> …` with this program's arguments, environment, working directory and stdin/stdout/
stderr (passed as file descriptors), forwards the signals Spark sends it (Spark stops a daemon with SIGTERM), and
exits with the forked process's status, so to Spark it is that process. It starts in ~15 ms (the interpreter with
`-I -S`, nothing but the standard library imported) where a fresh interpreter importing pyspark takes 0.3-0.5 s.

Anything else (`-c …`, Spark's version check; no server answering; the server refusing) runs the real interpreter
in this process's place (`os.execv`), so this program never does less than plain `python` would.

`fork_server.write_launcher` writes it out as an executable script: this module's source, then a call of `main` with
the real interpreter's path and the server's socket. The image's copy (`fork_server.install_launcher`) takes the
socket from the environment (`HANDOFF_FORK_SOCKET`), which a driver pod sets for its own JVM and its executor pods
never have: there, with no socket, this program is the real interpreter.
"""
from __future__ import annotations

import marshal
import os
import signal
import socket
import struct
import sys

#: The signals passed on to the forked process (Spark's `Process.destroy()` sends SIGTERM).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
#: Network order: a request's length, a pid, an exit status (negative: killed by that signal).
LENGTH, PID, STATUS = struct.Struct("!I"), struct.Struct("!i"), struct.Struct("!i")


def request(argv: list[str]) -> bytes:
    """The request for `argv`: its length, then marshal's bytes of (argv, working directory, environment)."""
    payload = marshal.dumps((argv, os.getcwd(), dict(os.environ)))
    return LENGTH.pack(len(payload)) + payload


def read_exactly(sock: socket.socket, size: int) -> bytes | None:
    """`size` bytes, or None when the other end closed first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def forked(socket_path: str, argv: list[str]) -> tuple[socket.socket, int] | None:
    """Ask the server at `socket_path` to fork `argv`; the connection and the forked pid, or None (run it here)."""
    if len(argv) < 2 or argv[0] != "-m":
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(socket_path)
        data = request(argv)
        sent = socket.send_fds(sock, [data], [0, 1, 2])
        sock.sendall(data[sent:])
        answer = read_exactly(sock, PID.size)
    except OSError:
        sock.close()
        return None
    pid = PID.unpack(answer)[0] if answer else 0
    if pid <= 0:
        sock.close()
        return None
    return sock, pid


def main(real_python: str, socket_path: str | None, argv: list[str]) -> None:
    """Run `argv` through the fork server at `socket_path`, or as `real_python` when it cannot (or there is none)."""
    found = forked(socket_path, argv) if socket_path else None
    if found is None:
        os.execv(real_python, [real_python, *argv])
    sock, pid = found

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    answer = read_exactly(sock, STATUS.size)
    status = STATUS.unpack(answer)[0] if answer else 1  # the server gone: the process went with it
    if status < 0:  # killed by a signal: so is this process, as Spark would have seen it
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status & 0xFF)

