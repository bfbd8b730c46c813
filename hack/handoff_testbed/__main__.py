"""`hack/testbed build|up|down|status` — the shell face of the test bed.

`up` starts components detached (each in its own process group), records their pids and exports in
the state dir, and prints `export NAME=value` lines for `eval "$(hack/testbed up kafka)"`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from .paths import state_dir
from .proc import stop_pid
from .registry import COMPONENTS, component
from .toolchains import kubectl_dir


def _state_file():
    return state_dir() / "state.json"


def _load() -> dict:
    try:
        return json.loads(_state_file().read_text())
    except FileNotFoundError:
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/testbed", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("build", "up"):
        p = sub.add_parser(cmd)
        p.add_argument("components", nargs="+", choices=sorted(COMPONENTS))
    sub.add_parser("down")
    sub.add_parser("status")
    args = parser.parse_args(argv)

    if args.cmd == "build":
        for name in args.components:
            print(f"# building {name} ...", file=sys.stderr, flush=True)
            component(name).build()
        return 0
    if args.cmd == "up":
        state = _load()
        # A component may need an earlier one's exports (the node registers with $KUBECONFIG).
        for entry in state.values():
            os.environ.update(entry["env"])
        for name in args.components:
            if name in state:
                print(f"# {name} already up", file=sys.stderr)
                continue
            comp = component(name)
            if name == "apiserver" and "node" in args.components:
                comp.fake_nodes = False  # type: ignore[attr-defined]  # pods go to the real node, not kwok's
            comp.build()
            workdir = state_dir() / name
            if workdir.exists():
                shutil.rmtree(workdir)
            env = comp.start(workdir)
            os.environ.update(env)
            state[name] = {"pids": comp.pids(), "env": env, "workdir": str(workdir)}
            _state_file().write_text(json.dumps(state, indent=2))
        for name in args.components:
            for key, value in state[name]["env"].items():
                print(f"export {key}={value}")
        if "apiserver" in args.components:
            # The test bed's kubectl (built with the apiserver, its release): `kubectl` in the shell that
            # evals this, as the README shows, with no kubectl installed on the machine.
            print(f'export PATH="{kubectl_dir()}:$PATH"')
        return 0
    if args.cmd == "status":
        print(json.dumps(_load(), indent=2))
        return 0
    if args.cmd == "down":
        state = _load()
        for name, entry in reversed(list(state.items())):
            for pid in entry["pids"]:
                stop_pid(pid)
            component(name).teardown(Path(entry["workdir"]))
            print(f"# stopped {name}", file=sys.stderr)
        shutil.rmtree(state_dir(), ignore_errors=True)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
