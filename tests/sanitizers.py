"""ASan + UBSan builds of the C extensions, and a child Python that runs code against them.

Why a child process: ASan must be the first library loaded (LD_PRELOAD of gcc's libasan), which the test process
(already running, with pyarrow's and Python's allocators in place) cannot be. The child also uses malloc for
everything (PYTHONMALLOC=malloc, ARROW_DEFAULT_MEMORY_POOL=system) so that ASan sees Python's and Arrow's buffers,
not only the extension's own; leak detection is off (Python leaks by design at exit). `-fno-sanitize-recover=all`
makes any UBSan finding fatal, so "exit code 0 and no sanitizer report" is the whole verdict.
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g", "-O1",
         "-shared", "-fPIC", "-Wall"]
#: What a sanitizer writes when it finds something (ASan: "ERROR: AddressSanitizer: heap-buffer-overflow ...",
#: UBSan: "file.c:123:45: runtime error: signed integer overflow ...").
REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "UndefinedBehaviorSanitizer")


def libasan() -> str:
    return subprocess.run(["gcc", "-print-file-name=libasan.so"], check=True, capture_output=True,
                           text=True).stdout.strip()


def source(module: str) -> Path:
    """The C source of the extension `module` (a dotted name, e.g. "handoff_spark.decode._json_arrow")."""
    return REPO / "spark_app" / Path(*module.split(".")).with_suffix(".c")


def build(module: str, out_dir: Path, libraries: tuple[str, ...] = (), src: Path | None = None) -> Path:
    """The extension `module` (dotted) compiled with the sanitizers into out_dir, from its source or `src`."""
    target = out_dir / f"{module.rsplit('.', 1)[-1]}{sysconfig.get_config_var('EXT_SUFFIX')}"
    src = src or source(module)
    subprocess.run(["gcc", *FLAGS, f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(target),
                    *(f"-l{lib}" for lib in libraries)], check=True, capture_output=True, text=True)
    return target


def preamble(extensions: dict[str, Path]) -> str:
    """Child-script code that makes each extension (dotted name → sanitized build) the one imported, and checks that
    it is."""
    lines = ["import importlib.util, sys",
             f"sys.path[:0] = [{str(REPO / 'tests' / 'unit')!r}, {str(REPO / 'tests')!r}]",
             "import importlib"]
    for module, path in extensions.items():
        parent, name = module.rsplit(".", 1)
        lines += [f"_parent = importlib.import_module({parent!r})",
                  f"_spec = importlib.util.spec_from_file_location({module!r}, {str(path)!r})",
                  "_mod = importlib.util.module_from_spec(_spec)",
                  "_spec.loader.exec_module(_mod)",
                  f"sys.modules[{module!r}] = _mod",
                  f"setattr(_parent, {name!r}, _mod)",
                  f"from {parent} import {name} as _check",
                  f"assert _check.__file__ == {str(path)!r}, _check.__file__"]
    return "\n".join(lines) + "\n"


def run(script: str, extensions: dict[str, Path], env: dict[str, str] | None = None,
        timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The script in a child Python under ASan + UBSan, with `extensions` (dotted name → sanitized .so)."""
    child_env = {**os.environ, **(env or {}), "LD_PRELOAD": libasan(),
                 "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=1",
                 "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1", "PYTHONMALLOC": "malloc",
                 "ARROW_DEFAULT_MEMORY_POOL": "system", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", preamble(extensions) + script], env=child_env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def findings(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The sanitizer report lines in the child's output."""
    return [line for line in (proc.stderr + proc.stdout).splitlines() if any(r in line for r in REPORTS)]
