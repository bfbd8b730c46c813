"""A fork server for the Python processes Spark's JVM starts in a local-mode driver: pyspark already imported.

Why: a (re)started driver's first commit waits on a chain of Python processes that Spark starts one after another
(`SparkEnv.createPythonWorker` is synchronized: docs/benchmarks.md, "Why the Python processes start one after
another"): the data-source lookup, the source's planner, the streaming source runner, the read and write planners,
the worker daemon and the commit runner. Each is a fresh interpreter that imports pyspark (0.3-0.5 s on a 2-core
node) and then what its module needs (the worker daemon preloads PyIceberg and pyarrow for ~1.4 s; the commit
runner imports the sink), while the CPU's other core idles. This server imports all of that once, while the JVM is
still launching (it starts at the session's build and needs nothing from it), and forks each of those processes
from itself when Spark asks for it: a fork with every module in place instead of an interpreter's start.

How Spark reaches it: `build_session` sets `PYSPARK_PYTHON` to a launcher script (`fork_client`, written by
`write_launcher` into the driver's own temporary directory) that hands the server its arguments, environment,
working directory and stdin/stdout/stderr, and stands for the forked process to Spark until it exits. A forked
process runs `-m module …` as `python -m` would (`runpy`), after taking the launcher's environment, directory and
`sys.path` (its `PYTHONPATH` first). Anything the server cannot do, or a server that is gone, runs the real
interpreter instead.

Where: a driver whose JVM runs its executors itself (a local master), and a driver pod whose executors run the same
image (a `k8s://` master). Executor pods have no server, so the pod's launcher must be a file of the image that
falls back to the real interpreter there: `install_launcher` writes it at the image's build (at the path
`HANDOFF_FORK_LAUNCHER` names) with no socket in it, and the driver names its socket in `HANDOFF_FORK_SOCKET`,
which only the driver's own JVM inherits. `HANDOFF_FORK_SERVER=0` turns it off.

Only imports happen before the first fork, and the server starts no thread of its own (pyarrow's jemalloc keeps a
background thread, which jemalloc's own fork handlers make safe), as in `worker_daemon`. A module that fails to import is skipped (the process that needs it fails with the real error).
"""
from __future__ import annotations

import gc
import importlib
import io
import marshal
import os
import runpy
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from handoff_spark import pyspark_private, switches
from handoff_spark.startup import fork_client, python_path

#: What the processes Spark starts for a Python data source import: pyspark, its daemon, worker and planners.
PRELOAD_PYSPARK = ("pyspark", *pyspark_private.PROCESS_MODULES)
#: The launcher script's name in the server's directory, and the socket's.
LAUNCHER, SOCKET = "python", "fork.sock"
#: How long the server waits for a connected launcher's request (it sends it at once).
REQUEST_TIMEOUT_SECONDS = 5.0


def preload_for(sink: str | None) -> tuple[str, ...]:
    """pyspark's modules, then what the worker daemon preloads for `sink` (the write path, the Kafka source)."""
    from handoff_spark.startup import worker_daemon

    return PRELOAD_PYSPARK + worker_daemon.preload_for(sink)


# ------------------------------------------------------------------------------------------- the driver's side


@dataclass
class ForkServer:
    """A running server: its process, and the launcher Spark runs as `python`."""

    process: subprocess.Popen[bytes]
    launcher: str
    directory: str
    sink: str | None
    socket: str
    _alive_pipe: int = field(repr=False, default=-1)

    def stop(self) -> None:
        """Stop the server (it stops the processes it forked that still run) and remove its directory."""
        if self._alive_pipe >= 0:
            os.close(self._alive_pipe)  # the server reads the end of file and exits
            self._alive_pipe = -1
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def write_launcher(path: Path, real_python: str, socket_source: str, mode: int = stat.S_IRWXU) -> None:
    """`fork_client`'s source as an executable script run by `real_python -I -S`, calling its `main` with the socket
    `socket_source` (Python source: the path's literal, or the environment's read of it) evaluates to."""
    source = Path(fork_client.__file__).read_text()
    path.write_text(f"#!{real_python} -IS\n{source}\nmain({real_python!r}, {socket_source}, sys.argv[1:])\n")
    path.chmod(mode)


def install_launcher(path: str) -> None:
    """The image's launcher at `path` (its build runs this): this interpreter's, readable and runnable by any user
    (the pods run as a non-root user), the socket the one `HANDOFF_FORK_SOCKET` names when it is set."""
    where = Path(path)
    where.parent.mkdir(parents=True, exist_ok=True)
    write_launcher(where, sys.executable, f"os.environ.get({switches.FORK_SOCKET.name!r})", mode=0o755)


def start(directory: str, sink: str | None, launcher: str | None = None) -> ForkServer:
    """Start the server in `directory` (the driver's own, 0700), preloading for `sink`, and write its launcher
    there; or, given the image's `launcher` (`install_launcher`), use that one: the caller then names the socket in
    `HANDOFF_FORK_SOCKET` for the JVM it launches.

    The socket is bound and listening before the server starts: a launcher that connects while the server imports
    waits in the backlog until the imports are done, instead of starting an interpreter of its own beside them."""
    if launcher is None and os.statvfs(directory).f_flag & os.ST_NOEXEC:  # /tmp noexec: Spark could not run it
        raise OSError(f"{directory} is on a file system mounted noexec")
    socket_path = str(Path(directory) / SOCKET)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(socket_path)  # OSError for a path longer than a socket's (108 bytes): the caller goes without
        os.chmod(socket_path, stat.S_IRUSR | stat.S_IWUSR)
        listener.listen(64)
    except OSError:
        listener.close()
        raise
    read_end, write_end = os.pipe()
    env = dict(os.environ)
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # as the worker daemon's (before pyarrow is imported)
    process = subprocess.Popen(
        [sys.executable, "-m", __name__, str(listener.fileno()), str(read_end), ",".join(preload_for(sink))],
        stdin=subprocess.DEVNULL, pass_fds=(listener.fileno(), read_end), env=env)
    os.close(read_end)
    listener.close()
    if launcher is None:
        launcher = str(Path(directory) / LAUNCHER)
        write_launcher(Path(launcher), sys.executable, repr(socket_path))
    return ForkServer(process, launcher, directory, sink, socket_path, write_end)


# ------------------------------------------------------------------------------------------- the server's side


@dataclass
class Child:
    pid: int
    pidfd: int
    conn: socket.socket


def receive(conn: socket.socket) -> tuple[list[str], str, dict[str, str], list[int]] | None:
    """A launcher's request and its three file descriptors, or None when it is not one."""
    conn.settimeout(REQUEST_TIMEOUT_SECONDS)
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
    if len(fds) != 3 or len(data) < fork_client.LENGTH.size:
        for fd in fds:
            os.close(fd)
        return None
    size = fork_client.LENGTH.unpack_from(data)[0]
    data = data[fork_client.LENGTH.size:]
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    try:
        argv, cwd, env = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        argv = None
    if len(data) != size or not isinstance(argv, list) or len(argv) < 2 or argv[0] != "-m":
        for fd in fds:
            os.close(fd)
        return None
    return argv, cwd, env, fds


def child_path(cwd: str, env: dict[str, str], base: list[str]) -> list[str]:
    """`sys.path` as `python -m` started in `cwd` with `env` would have it: the directory, `PYTHONPATH`, then the
    interpreter's own entries (`base`: the server's, without its directory and its own `PYTHONPATH`); without the
    archives on `PYTHONPATH` that hold no Python (`python_path`: Spark's core jar, which zipimport would read in
    every fork, twice). The server asks `python_path` before it forks, so the fork reads no archive."""
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and python_path.holds_python(p)]
    return list(dict.fromkeys([cwd, *extra, *base]))


def retitle(argv: list[str]) -> None:
    """In the forked process: the command line `ps` and /proc show becomes the one the process stands for
    (`<python> -m pyspark.daemon`), not the server's, so that a platform engineer reading a pod's processes sees
    what each one is; its parent (the server) says it is a fork. The server set SPT_NOENV, so the title is written
    over the server's own argv only (a longer one is cut at its length) and /proc/<pid>/environ stays readable."""
    try:
        from setproctitle import setproctitle
    except ImportError:  # an interpreter without it: the server's command line, as before
        return
    setproctitle(" ".join([sys.executable, *argv]))


def run_child(argv: list[str], cwd: str, env: dict[str, str], fds: list[int], base: list[str]) -> int:
    """In the forked process: become `python -m argv[1] argv[2:]` in `cwd` with `env` and the launcher's stdio.
    Returns the exit status."""
    retitle(argv)  # first: it reads SPT_NOENV from the server's environment
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True, write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, write_through=True,
                                  errors="backslashreplace")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter has it (the server ignores it)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = child_path(cwd, env, base)
    sys.argv = [argv[1], *argv[2:]]
    # runpy warns when the module is in sys.modules already: the server imported it on purpose (its point), and
    # `python -m` runs the module's code as `__main__` beside any imported copy either way. Without this, every
    # fork printed a RuntimeWarning into the driver's log.
    warnings.filterwarnings("ignore", message=r"'.*' found in sys\.modules after import of package",
                            category=RuntimeWarning, module="runpy")
    code = 0
    try:
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter does: the traceback on stderr, status 1
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def exit_status(wait_status: int) -> int:
    """What the launcher exits with: the exit code, or minus the signal that killed the process."""
    if os.WIFSIGNALED(wait_status):
        return -os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else 1


def serve(listener: socket.socket, alive_fd: int, modules: tuple[str, ...]) -> None:
    """Import `modules`, then fork a process for each launcher that connects to `listener`, until `alive_fd` (the
    driver's pipe) reads the end of file."""
    try:
        os.close(os.pidfd_open(os.getpid()))  # Linux 5.3 or later: how the server follows what it forked
    except OSError:
        return  # every launcher reads no pid and runs the real interpreter
    os.environ["SPT_NOENV"] = "1"  # retitle: the forks' titles over argv only, never over their environ
    for name in ("setproctitle", *modules):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the process that needs it imports it itself and fails there
            continue
    try:  # the archive Spark puts on its processes' PYTHONPATH, judged while the JVM still launches
        jars = Path(pyspark_private.spark_home()) / "jars"
        python_path.without_python(str(p) for p in jars.glob("spark-core_*.jar"))
    except Exception:  # noqa: BLE001 - judged at the first fork instead
        pass
    own = set(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    base = [p for p in sys.path[1:] if p not in own]
    gc.freeze()  # the imports' objects stay shared pages in every fork (as in worker_daemon)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(alive_fd, selectors.EVENT_READ, "driver")
    by_pidfd: dict[int, Child] = {}
    by_conn: dict[int, Child] = {}
    while True:
        for key, _events in sel.select():
            if key.data == "driver":  # the driver is gone, or stopped us
                for child in by_pidfd.values():
                    _kill(child.pid, signal.SIGTERM)
                return
            if key.data == "accept":
                conn, _ = listener.accept()
                try:
                    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                    req = receive(conn) if int.from_bytes(creds[4:8], sys.byteorder) == os.getuid() else None
                except (OSError, ValueError):
                    req = None
                if req is None:
                    conn.close()  # the launcher reads no pid and runs the real interpreter
                    continue
                argv, cwd, env, fds = req
                python_path.without_python(env.get("PYTHONPATH", "").split(os.pathsep))  # judged once, here
                sys.stdout.flush()
                sys.stderr.flush()
                try:
                    pid = os.fork()
                except OSError:  # no memory or processes left: the launcher runs the real interpreter (and fails so)
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                if pid == 0:
                    code = 1
                    try:
                        sel.close()
                        listener.close()
                        os.close(alive_fd)
                        for other in by_pidfd.values():
                            os.close(other.pidfd)
                            other.conn.close()
                        conn.close()
                        code = run_child(argv, cwd, env, fds, base)
                    finally:
                        os._exit(code & 0xFF)
                for fd in fds:
                    os.close(fd)
                try:
                    pidfd = os.pidfd_open(pid)
                except OSError:  # no fd left: the process must not run beside the interpreter the launcher starts
                    _kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    conn.close()
                    continue
                child = Child(pid, pidfd, conn)
                by_pidfd[child.pidfd] = child
                by_conn[conn.fileno()] = child
                conn.settimeout(None)
                try:
                    conn.sendall(fork_client.PID.pack(pid))
                except OSError:
                    _kill(pid, signal.SIGKILL)
                sel.register(child.pidfd, selectors.EVENT_READ, "exit")
                sel.register(conn, selectors.EVENT_READ, "launcher")
            elif key.data == "launcher":  # its launcher is gone (killed): so goes the process it stood for
                gone = by_conn.pop(key.fd, None)
                if gone is not None:
                    _kill(gone.pid, signal.SIGKILL)
                    sel.unregister(gone.conn)
            elif key.data == "exit":
                child = by_pidfd.pop(key.fd)
                _pid, wait_status = os.waitpid(child.pid, 0)
                sel.unregister(child.pidfd)
                os.close(child.pidfd)
                by_conn.pop(child.conn.fileno(), None)
                try:
                    sel.unregister(child.conn)
                except (KeyError, ValueError):
                    pass
                try:
                    child.conn.sendall(fork_client.STATUS.pack(exit_status(wait_status)))
                except OSError:
                    pass
                child.conn.close()


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def main() -> None:
    if sys.argv[1] == "--install-launcher":  # the image's build: `python -m handoff_spark.startup.fork_server …`
        install_launcher(sys.argv[2])
        return
    listener = socket.socket(fileno=int(sys.argv[1]))  # bound and listening already (`start`)
    alive_fd, modules = int(sys.argv[2]), tuple(m for m in sys.argv[3].split(",") if m)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver's Ctrl-C is the driver's to handle
    serve(listener, alive_fd, modules)


if __name__ == "__main__":
    main()
