"""Spark's Python processes forked from the driver's fork server (`startup.fork_server`, `startup.fork_client`).

Real processes throughout: a server started as the driver starts it, and its launcher run the way Spark's JVM runs
`pythonExec` (`<launcher> -m module …`, talking over stdin/stdout/stderr and the exit status)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from handoff_spark import switches
from handoff_spark.config import AppConfig
from handoff_spark.driver import app
from handoff_spark.startup import fork_server

#: A module run with `-m`: what it was given and where it runs, as one line of JSON on stdout.
PROBE = """
import json, os, sys
line = sys.stdin.readline().strip()
environ = open("/proc/self/environ", "rb").read().split(b"\\0")
print(json.dumps({"argv": sys.argv[1:], "stdin": line, "cwd": os.getcwd(), "env": os.environ.get("PROBE_VALUE"),
                  "ppid": os.getppid(), "pyspark_loaded": "pyspark.daemon" in sys.modules,
                  "cmdline": open("/proc/self/cmdline", "rb").read().decode().split("\\0")[0],
                  "environ_readable": all(b"=" in e for e in environ if e) and any(environ), "path": sys.path}))
code = os.environ.get("PROBE_EXIT")
if code == "raise":
    raise RuntimeError("the probe failed on purpose")
if code == "wait":
    sys.stdout.flush()
    import time
    time.sleep(60)
sys.exit(int(code or 0))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> Iterator[fork_server.ForkServer]:
    directory = tmp_path_factory.mktemp("fork")
    directory.chmod(0o700)
    started = fork_server.start(str(directory), "iceberg")
    yield started
    started.stop()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory short enough for a socket's path under it (pytest's, named for the test, is not)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="hf-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "handoff_fork_probe.py").write_text(PROBE)
    return tmp_path


def run(launcher: str, argv: list[str], probe_dir: Path, stdin: str = "hello\n", **env: str) -> Any:
    import json

    full_env = {**os.environ, "PYTHONPATH": str(probe_dir / "mods"), "PROBE_VALUE": "from-the-launcher", **env}
    done = subprocess.run([launcher, *argv], input=stdin, capture_output=True, text=True, env=full_env,
                          cwd=probe_dir, timeout=60)
    out = json.loads(done.stdout) if done.stdout.strip() else None
    return done, out


def test_a_module_runs_as_a_fork_of_the_server_with_the_launchers_io_env_cwd_and_path(server, probe_dir) -> None:
    done, out = run(server.launcher, ["-m", "handoff_fork_probe", "a", "b"], probe_dir)
    assert done.returncode == 0, done.stderr
    assert out["ppid"] == server.process.pid  # forked by the server, not a fresh interpreter
    assert out["pyspark_loaded"]  # ... which had pyspark's daemon imported before the fork
    # PYTHONPATH (where the module is) on its path, its arguments, the launcher's stdin, directory and environment
    assert out["argv"] == ["a", "b"] and out["stdin"] == "hello"
    assert out["cwd"] == str(probe_dir) and out["env"] == "from-the-launcher"
    # `ps` shows what it stands for, not the server's command line (fork_server.retitle), and its environ is intact
    assert out["cmdline"] == f"{sys.executable} -m handoff_fork_probe a b", out["cmdline"]
    assert out["environ_readable"]


def test_a_fork_has_no_archive_without_python_on_its_path(server, probe_dir) -> None:
    """Spark puts its core jar (no Python in it) on PYTHONPATH; zipimport would read its ~6,000-entry directory in
    every fork, twice (python_path). An archive with a module stays, as do plain directories."""
    import zipfile

    jar, modules = probe_dir / "spark-core.jar", probe_dir / "mods.zip"
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("org/apache/spark/SparkContext.class", b"\xca\xfe")
    with zipfile.ZipFile(modules, "w") as z:
        z.writestr("zipped_probe_module.py", "X = 1\n")
    path = os.pathsep.join([str(probe_dir / "mods"), str(jar), str(modules)])
    done, out = run(server.launcher, ["-m", "handoff_fork_probe"], probe_dir, PYTHONPATH=path)
    assert done.returncode == 0, done.stderr
    assert str(jar) not in out["path"]
    assert out["path"][:3] == [str(probe_dir), str(probe_dir / "mods"), str(modules)]


def test_a_module_the_server_imported_runs_without_runpys_warning(server, probe_dir) -> None:
    """The server imports Spark's worker modules on purpose; running one of them as `-m` made runpy warn ("found in
    sys.modules after import of package"), once per fork, into the driver's log."""
    done, _ = run(server.launcher, ["-m", "handoff_spark.config"], probe_dir)  # preloaded, no main block
    assert done.returncode == 0, done.stderr
    assert "RuntimeWarning" not in done.stderr and "found in sys.modules" not in done.stderr, done.stderr


def test_the_exit_status_and_an_uncaught_error_reach_the_launcher(server, probe_dir) -> None:
    done, _ = run(server.launcher, ["-m", "handoff_fork_probe"], probe_dir, PROBE_EXIT="3")
    assert done.returncode == 3
    done, out = run(server.launcher, ["-m", "handoff_fork_probe"], probe_dir, PROBE_EXIT="raise")
    assert done.returncode == 1 and out["ppid"] == server.process.pid
    assert "RuntimeError: the probe failed on purpose" in done.stderr
    done, _ = run(server.launcher, ["-m", "handoff_no_such_module_here"], probe_dir)
    assert done.returncode == 1 and "No module named handoff_no_such_module_here" in done.stderr


def test_anything_but_a_module_runs_the_real_interpreter(server, probe_dir) -> None:
    """Spark's version check (`-c …`) is not the server's: the launcher becomes the interpreter itself."""
    done = subprocess.run([server.launcher, "-c", "import os, sys; print(os.getppid(), sys.version_info[:2])"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert done.stdout.split()[0] == str(os.getpid())  # not forked by the server: exec'd in the launcher's place


def _started(launcher: str, probe_dir: Path) -> tuple[subprocess.Popen[str], int]:
    import json

    proc = subprocess.Popen([launcher, "-m", "handoff_fork_probe"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=probe_dir,
                            env={**os.environ, "PYTHONPATH": str(probe_dir / "mods"), "PROBE_EXIT": "wait"})
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("x\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    forked = [int(p) for p in Path(f"/proc/{json.loads(line)['ppid']}/task/{json.loads(line)['ppid']}/children")
              .read_text().split()]
    return proc, forked[-1]


def _gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(") ")[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_spark_stopping_the_launcher_stops_the_forked_process(server, probe_dir) -> None:
    """Spark stops a daemon with SIGTERM to the process it started: the forked process gets it, and the launcher
    ends as that process did (killed by SIGTERM)."""
    proc, forked = _started(server.launcher, probe_dir)
    proc.terminate()
    assert proc.wait(10) == -signal.SIGTERM
    assert _gone(forked)


def test_a_killed_launcher_takes_its_forked_process_with_it(server, probe_dir) -> None:
    proc, forked = _started(server.launcher, probe_dir)
    proc.kill()
    assert proc.wait(10) == -signal.SIGKILL
    assert _gone(forked)  # the server saw its launcher go


def test_without_a_server_the_launcher_is_the_real_interpreter(short_tmp, probe_dir) -> None:
    """A server that died (or never answered) costs nothing but the interpreter's own start."""
    directory = short_tmp / "gone"
    directory.mkdir(mode=0o700)
    dead = fork_server.start(str(directory), None)
    dead.process.kill()
    dead.process.wait()
    done, out = run(dead.launcher, ["-m", "handoff_fork_probe", "z"], probe_dir)
    assert done.returncode == 0 and out["argv"] == ["z"] and out["ppid"] == os.getpid()
    dead.stop()


def test_stopping_ends_the_server_and_what_it_forked_and_removes_its_directory(short_tmp, probe_dir) -> None:
    directory = short_tmp / "stopped"
    directory.mkdir(mode=0o700)
    started = fork_server.start(str(directory), None)
    proc, forked = _started(started.launcher, probe_dir)
    started.stop()
    assert started.process.returncode == 0  # the driver closing its pipe ends the server
    assert _gone(forked) and proc.wait(10) != 0
    assert not directory.exists()


SINKS = {"iceberg": {"kind": "iceberg", "table": "t.t"},
         "bigquery": {"kind": "bigquery", "project": "p", "dataset": "d", "table": "t"}}


def _cfg(tmp_path: Path, master: str, sink: str = "iceberg") -> AppConfig:
    return AppConfig.model_validate({
        "handoffId": "test/fork", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "sink": SINKS[sink], "schema": {"onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path), "sparkConf": {"spark.master": master}})


def test_the_driver_uses_it_for_a_local_master_and_leaves_a_users_python_and_the_switch_alone(
        tmp_path, short_tmp, monkeypatch) -> None:
    _a_driver_with_tmpdir(monkeypatch, short_tmp)  # the server's directory: the driver's own, under TMPDIR
    # executors in other pods, and no launcher of the image's that they would have too
    assert app.use_fork_server(_cfg(tmp_path, "k8s://https://127.0.0.1:1")) is None
    monkeypatch.setenv(switches.FORK_SERVER.name, "0")
    assert app.use_fork_server(_cfg(tmp_path, "local[1]")) is None
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/their/python")  # a user's own Python for Spark
    monkeypatch.setenv(switches.FORK_SERVER.name, "1")
    assert app.use_fork_server(_cfg(tmp_path, "local[1]")) is None
    assert os.environ["PYSPARK_PYTHON"] == "/opt/their/python"
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    try:
        launcher = app.use_fork_server(_cfg(tmp_path, "local[1]"))
        assert launcher is not None and os.environ["PYSPARK_PYTHON"] == launcher
        assert os.environ["PYSPARK_DRIVER_PYTHON"] == launcher  # the JVM's data-source lookup forks too
        assert Path(launcher).parent.name.startswith(f"{app.FORK_DIR_PREFIX}{os.getpid()}-")
        assert app.use_fork_server(_cfg(tmp_path, "local[2]")) == launcher  # one server per driver process
        first = app._fork_server
        # ... per sink: a session of another sink (a test process's) gets a server that preloads its write path
        other = app.use_fork_server(_cfg(tmp_path, "local[1]", "bigquery"))
        assert other is not None and other != launcher and os.environ["PYSPARK_PYTHON"] == other
        assert os.environ["PYSPARK_DRIVER_PYTHON"] == other
        assert first is not None and first.process.returncode == 0 and not Path(launcher).exists()
        # turned off later in the same process: Spark's Python is the interpreter again
        monkeypatch.setenv(switches.FORK_SERVER.name, "0")
        assert app.use_fork_server(_cfg(tmp_path, "local[1]")) is None
        assert os.environ["PYSPARK_PYTHON"] == os.environ["PYSPARK_DRIVER_PYTHON"] == sys.executable
        # a user's own PYSPARK_DRIVER_PYTHON is theirs: only Spark's Python becomes the launcher
        monkeypatch.setenv(switches.FORK_SERVER.name, "1")
        monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "/opt/their/python")
        again = app.use_fork_server(_cfg(tmp_path, "local[1]"))
        assert again is not None and os.environ["PYSPARK_PYTHON"] == again
        assert os.environ["PYSPARK_DRIVER_PYTHON"] == "/opt/their/python"
    finally:
        if app._fork_server is not None:
            app._fork_server.stop()


def _a_driver_with_tmpdir(monkeypatch: Any, tmpdir: Path) -> None:
    """This process as a local driver about to build its first session, its temporary directory `tmpdir`."""
    monkeypatch.setattr(app, "_fork_server", None)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv(switches.FORK_SERVER.name, raising=False)
    monkeypatch.delenv(switches.FORK_LAUNCHER.name, raising=False)
    monkeypatch.delenv(switches.FORK_SOCKET.name, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr("tempfile.tempdir", None)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.mark.parametrize("why", ["socket path too long", "noexec"])
def test_a_temporary_directory_the_server_cannot_use_leaves_spark_its_own_interpreter(
        tmp_path, short_tmp, monkeypatch, why) -> None:
    """It costs the speed-up, never the start, and leaves nothing behind: a temporary directory too deep for a Unix
    socket's path (108 bytes), or a /tmp mounted noexec (a hardened pod's emptyDir), where Spark could not run the
    launcher (the mount flag is what `os.statvfs` reports: this machine has no noexec file system to make one on)."""
    tmpdir = short_tmp
    if why == "noexec":
        real_statvfs = os.statvfs

        class NoExec:
            def __init__(self, path: str) -> None:
                self.f_flag = real_statvfs(path).f_flag | os.ST_NOEXEC

        monkeypatch.setattr(fork_server.os, "statvfs", NoExec)
    else:
        tmpdir = short_tmp / ("d" * 60) / ("e" * 60)
        tmpdir.mkdir(parents=True)
    _a_driver_with_tmpdir(monkeypatch, tmpdir)
    assert app.use_fork_server(_cfg(tmp_path, "local[1]")) is None
    assert os.environ["PYSPARK_PYTHON"] == os.environ["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert app._fork_server is None
    assert not list(tmpdir.glob(f"{app.FORK_DIR_PREFIX}*"))


@pytest.fixture
def image_launcher(short_tmp: Path) -> Path:
    """The image's launcher, installed as the Dockerfile does (`python -m … --install-launcher PATH`)."""
    path = short_tmp / "image" / "bin" / "fork-python"
    done = subprocess.run([sys.executable, "-m", "handoff_spark.startup.fork_server", "--install-launcher",
                           str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return path


def test_the_images_launcher_forks_where_the_socket_is_named_and_is_python_where_it_is_not(
        server, image_launcher, probe_dir) -> None:
    """A driver pod names its server's socket for its JVM (`HANDOFF_FORK_SOCKET`); its executor pods run the same
    file without it, or with a socket that is not there, and get the real interpreter."""
    assert image_launcher.stat().st_mode & 0o777 == 0o755  # the pods run as a non-root user
    done, out = run(str(image_launcher), ["-m", "handoff_fork_probe", "p"], probe_dir,
                    **{switches.FORK_SOCKET.name: server.socket})
    assert done.returncode == 0, done.stderr
    assert out["ppid"] == server.process.pid and out["pyspark_loaded"] and out["argv"] == ["p"]
    env = {k: v for k, v in os.environ.items() if k != switches.FORK_SOCKET.name}
    for socket_env in ({}, {switches.FORK_SOCKET.name: str(image_launcher.parent / "no.sock")}):
        done = subprocess.run([str(image_launcher), "-m", "handoff_fork_probe", "e"], input="x\n",
                              capture_output=True, text=True, timeout=60, cwd=probe_dir,
                              env={**env, **socket_env, "PYTHONPATH": str(probe_dir / "mods")})
        assert done.returncode == 0, done.stderr
        assert '"ppid": %d' % os.getpid() in done.stdout and '"pyspark_loaded": false' in done.stdout, socket_env


def test_a_driver_pod_uses_the_images_launcher_when_its_executors_run_the_same_image(
        tmp_path, short_tmp, image_launcher, monkeypatch) -> None:
    _a_driver_with_tmpdir(monkeypatch, short_tmp)
    k8s = "k8s://https://127.0.0.1:1"
    image = {"spark.kubernetes.container.image": "handoff:1"}
    monkeypatch.setenv("PYSPARK_PYTHON", "python3" if _python3_beside_this_one() else sys.executable)
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    monkeypatch.setenv(switches.FORK_LAUNCHER.name, str(image_launcher))
    # the executors run another image, which may have no such file: no server
    other = {**image, app.EXECUTOR_IMAGE_KEY: "theirs:2"}
    assert app.fork_server_launcher(k8s, other, os.environ) is None
    # spark-submit started this Python: its JVM is up already
    assert app.fork_server_launcher(k8s, image, {**os.environ, "PYSPARK_GATEWAY_PORT": "1"}) is None
    # a launcher that is not there (another image's variable): no server either
    assert app.fork_server_launcher(k8s, image, {switches.FORK_LAUNCHER.name: "/no/such/launcher"}) is None
    # a local master without the image's launcher writes its own
    assert app.fork_server_launcher("local[1]", {}, {}) == ""
    cfg = _cfg(tmp_path, k8s)
    cfg.spark_conf.update({**image, app.EXECUTOR_IMAGE_KEY: "handoff:1"})
    try:
        launcher = app.use_fork_server(cfg)
        assert launcher == str(image_launcher) == os.environ["PYSPARK_PYTHON"]
        assert app._fork_server is not None and os.environ[switches.FORK_SOCKET.name] == app._fork_server.socket
        assert Path(app._fork_server.socket).is_socket()
        assert not (Path(app._fork_server.directory) / fork_server.LAUNCHER).exists()  # none written: the image's
    finally:
        if app._fork_server is not None:
            app._fork_server.stop()


def _python3_beside_this_one() -> bool:
    beside = Path(sys.executable).with_name("python3")
    return beside.exists() and os.path.samefile(beside, sys.executable)


def test_spark_python_is_this_interpreter_by_path_or_by_a_name_found_beside_it(monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    assert app.runs_this_python(None) and app.runs_this_python(sys.executable)
    if _python3_beside_this_one():  # the image's `PYSPARK_PYTHON=python3`, in its virtualenv
        assert app.runs_this_python("python3")
    assert not app.runs_this_python("/opt/their/python") and not app.runs_this_python("no-such-python")
