"""The driver entry points.

- `python -m handoff_spark run --config app.json [--available-now] [--sink FORMAT] [--metrics-port-fallback]`: the
  handoff's stream;
- `python -m handoff_spark backfill --config app.json --query NAME --from JSON --to JSON [--checkpoint DIR]`:
  re-read `[from, to)` (`{"topic": {"partition": offset}}`) into the table under its own ledger query NAME,
  without moving the stream's position; refused when the table already holds any of the range. Resumable: run
  it again with the same NAME and checkpoint and it goes on from its own ledger entries.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from handoff_spark import contract
from handoff_spark.config import AppConfig
from handoff_spark.startup.early_session import from_py4j

#: Kubernetes' default terminationMessagePath: what a pod's `lastState.terminated.message` shows (the operator's
#: status.app.lastFailure).
TERMINATION_LOG = "/dev/termination-log"


def refuse(message: str) -> int:
    """A start the driver refuses for a reason a person must act on: one line, no traceback, exit 2."""
    print(f"handoff: {message}", file=sys.stderr, flush=True)
    if os.path.exists(TERMINATION_LOG):
        try:
            with open(TERMINATION_LOG, "w") as fh:
                fh.write(message[:4000])
        except OSError:
            pass
    return 2


def parser() -> argparse.ArgumentParser:
    """The driver's command line; the operator writes it with `contract.run_command` / `backfill_command`."""
    parser = argparse.ArgumentParser(prog=f"python -m {contract.DRIVER_MODULE}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(contract.RUN, help="run the hand-off described by an app config")
    run.add_argument(contract.CONFIG_FLAG, required=True,
                     help="AppConfig JSON (rendered by the operator or `handoff run`)")
    run.add_argument(contract.AVAILABLE_NOW_FLAG, action="store_true",
                     help="drain what is in the topics now, then exit 0 (Trigger.AvailableNow)")
    run.add_argument("--sink", default=None,
                     help="override the sink with a built-in Spark sink (noop, console): benchmarks/debugging only")
    run.add_argument(contract.METRICS_PORT_FALLBACK_FLAG, action="store_true",
                     help="when the config's metricsPort is taken, serve metrics on a free port (printed) instead "
                          "of refusing to start (`handoff run` without --metrics-port; the operator's drivers keep "
                          "their fixed, scraped port)")
    back = sub.add_parser(contract.BACKFILL, help="re-read an offset range into the table under its own ledger query")
    back.add_argument(contract.CONFIG_FLAG, required=True, help="the handoff's AppConfig JSON")
    back.add_argument(contract.QUERY_FLAG, required=True,
                      help="ledger query name of this backfill, e.g. backfill-<request>")
    back.add_argument(contract.FROM_FLAG, dest="from_", required=True,
                      help='start offsets (inclusive) {"topic": {"0": 10}}')
    back.add_argument(contract.TO_FLAG, required=True, help="end offsets (exclusive), same partitions as --from")
    back.add_argument(contract.CHECKPOINT_FLAG, default=None,
                      help="checkpoint of this backfill (default: beside the handoff's, named after --query)")
    return parser


def py4j_chatter(record: logging.LogRecord) -> bool:
    """False for py4j's records below WARNING: its connection chatter ("Closing down clientserver connection" at
    every exit, a lost connection's retried command), whichever logger it uses (py4j 0.10.9.9 logs some on the root
    logger). Its real errors reach the driver as exceptions (Py4JNetworkError, Py4JJavaError). Once a stopping or
    refusing driver kills the JVM it was launching, `EarlySession.abandon` drops py4j's records of any level."""
    return record.levelno >= logging.WARNING or not from_py4j(record)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(py4j_chatter)
    try:
        cfg = AppConfig.load(args.config)
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        errors = getattr(exc, "errors", None)
        detail = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in errors()) if errors else exc
        return refuse(f"app config {args.config}: {detail}")
    from handoff_spark.driver.app import run as run_app
    from handoff_spark.errors import HandoffConfigError

    available_now = args.available_now if args.command == contract.RUN else True
    if args.command == contract.BACKFILL:
        try:
            cfg = backfill_config(cfg, args.query, json.loads(args.from_), json.loads(args.to), args.checkpoint)
        except ValueError as exc:
            return refuse(f"backfill: {exc}")
    try:
        return run_app(cfg, available_now=available_now, sink_format=getattr(args, "sink", None),
                       echo=lambda line: print(line, flush=True),
                       metrics_port_fallback=getattr(args, "metrics_port_fallback", False))
    except HandoffConfigError as exc:
        return refuse(str(exc))


def backfill_config(cfg: AppConfig, query: str, start: dict, end: dict, checkpoint: str | None) -> AppConfig:
    """The stream's config turned into a backfill's: own query name, own checkpoint, bounded range."""
    from handoff_spark.checkpoint import sibling
    from handoff_spark.config import BackfillRange

    if query == cfg.query_name:
        raise ValueError(f"--query must differ from the stream's query {cfg.query_name!r}")
    rng = BackfillRange.model_validate({"from": start, "to": end})
    for (topic, p), (lo, hi) in rng.ranges().items():
        if topic not in cfg.source.topics:
            raise ValueError(f"topic {topic!r} is not one of the handoff's topics {list(cfg.source.topics)}")
        if hi < lo:
            raise ValueError(f"{topic}[{p}]: --to ({hi}) is before --from ({lo})")
    if set(rng.ranges()) != {(t, p) for t, parts in rng.to.items() for p in parts}:
        raise ValueError("--from and --to must name the same partitions")
    where = checkpoint or sibling(cfg.checkpoint_location, f"{query}-checkpoint")
    return cfg.model_copy(update={"query_name": query, "backfill": rng, "checkpoint_location": where,
                                  "metrics_port": None, "trigger_interval_seconds": 0})


if __name__ == "__main__":
    sys.exit(main())
