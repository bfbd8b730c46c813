"""The benchmark scripts still start: bench/ mirrors the packages (bench/spark/<folder>/, bench/operator/<folder>/),
its scripts run rarely and by hand, so a move or a rename in the packages can break one unseen until someone needs
its figures. None of the benchmarks runs here; each script only answers `--help` (its top-level imports and the
paths it puts on sys.path), the project modules every script imports inside its functions are checked to exist, and
`bench/run_all.py` (`make bench`) is held to the scripts on disk.

Each check runs in a fresh, isolated interpreter (`-I`: no PYTHONPATH, no user site), from a scratch directory, as
`python bench/<folder>/<script>.py` would run, so a script must find the packages, the test bed (hack/) and the
shared modules (bench/*.py) through its own `ROOT`; and every project module it loaded must be this checkout's
(the venv's editable install could otherwise answer for a path the script forgot)."""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench"
#: The project's own importable code besides bench/'s shared modules: the two packages and the test bed.
PROJECT_PACKAGES = {"handoff_spark", "handoff_operator", "handoff_testbed"}


def _has_main(path: Path) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(path.read_text()).body)


def _python_files() -> list[Path]:
    return sorted(p for p in BENCH.rglob("*.py") if "results" not in p.relative_to(BENCH).parts)


#: The scripts (a `main`), as paths under bench/; `run_all.py` is one, `make bench` itself.
SCRIPTS = [p.relative_to(BENCH).as_posix() for p in _python_files() if _has_main(p)]
#: The shared modules: what the scripts import from bench/ itself.
SHARED = [p.relative_to(BENCH).as_posix() for p in _python_files() if not _has_main(p)]

# Runs `script --help` as `python script` would (its folder first on sys.path), then lists the project modules
# loaded from outside this checkout.
_HELP = """
import runpy, sys
script, root = sys.argv[1], sys.argv[2]
sys.path.insert(0, script.rsplit("/", 1)[0])
sys.argv = [script, "--help"]
try:
    runpy.run_path(script, run_name="__main__")
    code = 0
except SystemExit as e:
    code = e.code or 0
foreign = sorted(name for name, m in list(sys.modules.items())
                 if name.split(".")[0] in ("handoff_spark", "handoff_operator", "handoff_testbed")
                 and getattr(m, "__file__", None) and not m.__file__.startswith(root + "/"))
if foreign:
    print("loaded from outside", root, ":", foreign, file=sys.stderr)
    code = code or 3
sys.exit(code)
"""


def _help(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-c", _HELP, str(BENCH / script), str(ROOT)],
                          cwd=cwd, capture_output=True, text=True, timeout=180)


def test_the_scripts_sit_in_the_package_folders():
    """A question's script is in bench/spark/<folder>/ or bench/operator/<folder>/, named for a folder of its
    package; bench/ itself holds only run_all.py and the shared modules."""
    assert len(SCRIPTS) > 10 and SHARED
    packages = {"spark": ROOT / "spark_app" / "handoff_spark", "operator": ROOT / "operator" / "handoff_operator"}
    misplaced = [s for s in SCRIPTS if s != "run_all.py"
                 and not (len(Path(s).parts) == 3 and Path(s).parts[0] in packages
                          and (packages[Path(s).parts[0]] / Path(s).parts[1] / "__init__.py").is_file())]
    assert misplaced == []
    assert [s for s in SHARED if "/" in s] == []


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_runs_in_a_fresh_interpreter(script, tmp_path):
    run = _help(script, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "usage:" in run.stdout


def _project_imports(path: Path) -> set[tuple[str, str | None]]:
    """(module, name) for every import of project code in `path`, at the top or inside a function (those run only
    with the benchmark, so `--help` does not reach them); name None for a plain `import module`."""
    ours = PROJECT_PACKAGES | {Path(s).stem for s in SHARED}
    found: set[tuple[str, str | None]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in ours:
                found |= {(node.module, a.name) for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {(a.name, None) for a in node.names if a.name.split(".")[0] in ours}
    return found


# Imports each (module, name) with bench/, hack/ and both packages on the path, as the scripts set it; prints what
# is missing.
_IMPORTS = """
import importlib, json, os, sys
root, paths, wanted = sys.argv[1], sys.argv[2].split(os.pathsep), json.loads(sys.argv[3])
sys.path[:0] = paths
missing = []
for module, name in wanted:
    try:
        m = importlib.import_module(module)
    except Exception as e:
        missing.append(f"{module}: {type(e).__name__}: {e}")
        continue
    if not m.__file__.startswith(root + "/"):
        missing.append(f"{module}: from {m.__file__}, not this checkout")
    if name is not None and not hasattr(m, name):
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            missing.append(f"{module}.{name}")
print(json.dumps(missing))
"""


def test_every_project_import_resolves(tmp_path):
    wanted = sorted({imp for p in _python_files() for imp in _project_imports(p)}, key=str)
    assert any(m == "bench_pipelines" for m, _ in wanted)
    paths = [str(BENCH), str(ROOT / "hack"), str(ROOT / "operator"), str(ROOT / "spark_app")]
    run = subprocess.run([sys.executable, "-I", "-c", _IMPORTS, str(ROOT), os.pathsep.join(paths), json.dumps(wanted)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


def _run_all() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run_all", BENCH / "run_all.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_run_all_names_exactly_the_scripts():
    """`make bench` runs every script in `BENCHES` and says in `BY_HAND` why it leaves each other one out: a script
    moved, added or removed without run_all.py knowing fails here, not as a `not present, skipped` line."""
    run_all = _run_all()
    run = [script for script, _full, _quick in run_all.BENCHES.values()]
    by_hand = list(run_all.BY_HAND)
    assert len(run) == len(set(run)) and not set(run) & set(by_hand)
    assert sorted(run + by_hand) == sorted(s for s in SCRIPTS if s != "run_all.py")
    # Each benchmark is named for its script (and its results/<name>.json).
    assert all(Path(script).stem == name for name, (script, _f, _q) in run_all.BENCHES.items())
    assert all(reason.strip() for reason in run_all.BY_HAND.values())


def test_help_checks_are_not_vacuous(tmp_path):
    """The --help check fails a script whose imports do not resolve (so a pass above means something)."""
    broken = tmp_path / "broken.py"
    broken.write_text("import argparse\nimport bench_no_such_module\n\n\n"
                      "def main():\n    argparse.ArgumentParser().parse_args()\n")
    run = subprocess.run([sys.executable, "-I", "-c", _HELP, str(broken), str(ROOT)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "bench_no_such_module" in run.stderr
