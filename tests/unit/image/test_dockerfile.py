"""Checks of the Dockerfile that need no build (`make image` builds it for real, and the in-cluster e2e
runs it: tests/e2e/test_in_cluster.py):
every COPY source exists and is not excluded by .dockerignore, the dependency step names only pinned
packages, the entrypoint script is valid bash and routes to the handoff CLI, and the image runs as the
uid the chart expects. tests/integration/image/test_image_entrypoint.py runs the executor branch for real."""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]


def instructions() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)  # line continuations
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def dockerignore() -> list[str]:
    return [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines() if p.strip()
            and not p.startswith("#")]


def ignored(path: str) -> bool:
    for pattern in dockerignore():
        pattern = pattern.removeprefix("**/")
        parts = Path(path).parts
        if any(fnmatch.fnmatch("/".join(parts[:i + 1]), pattern) or fnmatch.fnmatch(part, pattern)
               for i, part in enumerate(parts)):
            return True
    return False


def test_base_image_and_java() -> None:
    ins = instructions()
    # The public base by default; `make image` passes a debootstrapped Debian as BASE where no registry is.
    assert ins[0] == ("ARG", "BASE=python:3.11-slim-bookworm")
    assert ins[1] == ("FROM", "${BASE}")
    run = " ".join(rest for op, rest in ins if op == "RUN")
    assert "openjdk-17-jre-headless" in run
    env = " ".join(rest for op, rest in ins if op == "ENV")
    assert "JAVA_HOME=/opt/java" in env


def test_the_local_file_system_jar_is_built_before_the_class_data_archive_records_the_class_path() -> None:
    """The executors start with the archive's recorded class path (docker/entrypoint.sh) and the JVM uses an archive
    only with the jars it was made from: a jar added to Spark's jars after it would turn the archive off."""
    runs = [rest for op, rest in instructions() if op == "RUN"]
    local_fs = next(i for i, r in enumerate(runs) if "local_fs.py build" in r)
    archive = next(i for i, r in enumerate(runs) if "jvm_cds.py" in r)
    assert local_fs < archive
    assert "openjdk-17-jdk-headless" in runs[local_fs] and "apt-get purge" in runs[local_fs]


def test_copy_sources_exist_and_reach_the_build_context() -> None:
    copies = [shlex.split(rest) for op, rest in instructions() if op == "COPY"]
    assert copies
    for args in copies:
        for src in args[:-1]:
            assert (REPO / src).exists(), f"COPY {src}: missing"
            assert not ignored(src), f"COPY {src}: excluded by .dockerignore"
    # Everything the package build needs is copied.
    copied = {src for args in copies for src in args[:-1]}
    assert {"pyproject.toml", "requirements.lock", "operator", "spark_app"} <= copied


def test_runtime_dependencies_are_all_pinned_by_the_lock() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    lock = {m.group(1).lower().replace("_", "-") for m in
            re.finditer(r"^([A-Za-z0-9_.-]+)==", (REPO / "requirements.lock").read_text(), re.M)}
    for dep in deps:
        name = re.split(r"[\[=<>!~ ;]", dep, maxsplit=1)[0].lower().replace("_", "-")
        assert name in lock, f"{name} is not pinned in requirements.lock"


def test_entrypoint_user_and_chart_agree() -> None:
    ins = dict((op, rest) for op, rest in instructions())
    entry = yaml.safe_load(ins["ENTRYPOINT"])
    assert entry[0] == "/usr/bin/tini" and entry[-1] == "/usr/local/bin/handoff-entrypoint"
    copy_dest = {shlex.split(rest)[-1]: shlex.split(rest)[0] for op, rest in instructions() if op == "COPY"}
    assert copy_dest["/usr/local/bin/handoff-entrypoint"] == "docker/entrypoint.sh"
    assert os.access(REPO / "docker/entrypoint.sh", os.X_OK)
    assert ins["USER"] == "185"
    values = yaml.safe_load((REPO / "charts/handoff-operator/values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 185
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "handoff" in scripts


def test_entrypoint_script_routes_to_the_cli() -> None:
    script = REPO / "docker/entrypoint.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(["bash", str(script), "--help"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "operator" in out.stdout and "run" in out.stdout


def _runtime_closure() -> set[str]:
    """Distributions the image installs: pyproject's runtime dependencies and everything they require
    (extras included where pyproject names them), as installed in this environment."""
    from importlib import metadata
    from packaging.requirements import Requirement

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    todo = [Requirement(d) for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = norm(req.name)
        key = name + "[" + ",".join(sorted(req.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        seen.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in (req.extras or {""})):
                todo.append(sub)
    return {s for s in seen if "[" not in s}


def test_every_third_party_import_is_a_runtime_dependency() -> None:
    """The image installs only the runtime dependencies (not the lock's test tools), so an import of a
    package that only a test tool pulls in would pass every test here and crash in the image."""
    import ast
    from importlib import metadata

    closure = _runtime_closure()
    dists_of = metadata.packages_distributions()
    local = {"handoff_operator", "handoff_spark"}
    missing: dict[str, set[str]] = {}
    for root in ("operator/handoff_operator", "spark_app/handoff_spark"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name.split(".")[0] for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module.split(".")[0]]
                for top in names:
                    if top in local or top in sys.stdlib_module_names or top not in dists_of:
                        continue
                    dists = {re.sub(r"[-_.]+", "-", d).lower() for d in dists_of[top]}
                    if not dists & closure:
                        missing.setdefault(top, set()).add(str(path.relative_to(REPO)))
    assert not missing, ("imported but not a runtime dependency in pyproject.toml (the image would lack "
                         f"them): {missing}")
