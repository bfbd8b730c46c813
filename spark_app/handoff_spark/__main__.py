"""`python -m handoff_spark run --config app.json [--available-now] [--sink FORMAT]` — the driver entry point."""
from __future__ import annotations

import argparse
import logging
import sys

from .config import AppConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m handoff_spark")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the hand-off described by an app config")
    run.add_argument("--config", required=True, help="AppConfig JSON (rendered by the operator or `handoff run`)")
    run.add_argument("--available-now", action="store_true",
                     help="drain what is in the topics now, then exit 0 (Trigger.AvailableNow)")
    run.add_argument("--sink", default=None,
                     help="override the sink with a built-in Spark sink (noop, console): benchmarks/debugging only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    cfg = AppConfig.load(args.config)
    from .app import run as run_app

    return run_app(cfg, available_now=args.available_now, sink_format=args.sink,
                   echo=lambda line: print(line, flush=True))


if __name__ == "__main__":
    sys.exit(main())
