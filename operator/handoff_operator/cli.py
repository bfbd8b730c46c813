"""`handoff` console script.

- `handoff operator`: run the operator with settings from the environment (HANDOFF_NAMESPACES,
  HANDOFF_LOG_LEVEL, HANDOFF_METRICS_PORT, HANDOFF_STATUS_INTERVAL, ...); same as
  `kopf run -m handoff_operator` plus the Prometheus endpoint and namespace selection.
- `handoff run -f handoff.yaml`: run one StreamTableHandoff locally (Spark local mode) by rendering its
  app config exactly as the operator would and starting the data plane's entry point
  (`python -m handoff_spark run --config ...`).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def _operator(args: argparse.Namespace) -> int:
    import kopf

    from . import handlers, metrics  # noqa: F401 - importing registers the handlers
    from .settings import OperatorSettings

    settings = OperatorSettings()
    if args.namespace:
        settings = settings.model_copy(update={"namespaces": list(args.namespace)})
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if settings.metrics_port is not None:
        metrics.serve(settings.metrics_port)
    kwargs: dict[str, Any] = {"standalone": args.standalone,
                              "liveness_endpoint": args.liveness}
    if settings.namespaces:
        kwargs["namespaces"] = settings.namespaces
    else:
        kwargs["clusterwide"] = True
    kopf.run(**kwargs)
    return 0


def local_config(manifest: dict[str, Any], checkpoint: str | None, master: str) -> str:
    """The app config JSON for a local run of a StreamTableHandoff manifest."""
    from .render import app_config
    from .validation import parse_spec

    meta = manifest.get("metadata") or {}
    name, namespace = meta.get("name", "handoff"), meta.get("namespace", "default")
    spec, problems = parse_spec(manifest.get("spec") or {})
    if spec is None:
        raise SystemExit("invalid spec:\n" + "\n".join(f"  {p}" for p in problems))
    if spec.source.properties_from or (spec.sink.iceberg and spec.sink.iceberg.catalog.properties_from):
        print("note: propertiesFrom (Secrets) is not resolved locally; put the values in properties",
              file=sys.stderr)
    config = app_config(spec, namespace, name, image="local")
    location = checkpoint or spec.checkpoint.location or str(Path(".handoff", namespace, name,
                                                                  "checkpoint").resolve())
    conf = {"spark.master": master, **spec.spark.spark_conf}
    config = config.model_copy(update={"spark_conf": conf, "checkpoint_location": location,
                                       "progress_file": None})
    return config.to_json()


def _run(args: argparse.Namespace) -> int:
    import yaml

    docs = [d for d in yaml.safe_load_all(Path(args.file).read_text()) if d]
    manifests = [d for d in docs if d.get("kind") == "StreamTableHandoff"]
    if len(manifests) != 1:
        raise SystemExit(f"{args.file}: expected exactly one StreamTableHandoff, found {len(manifests)}")
    text = local_config(manifests[0], args.checkpoint, args.master)
    if args.print_config:
        print(text)
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        fh.write(text)
    try:
        extra = ["--available-now"] if args.available_now else []
        child = subprocess.Popen([sys.executable, "-m", "handoff_spark", "run", "--config", fh.name, *extra])

        # Forward SIGTERM (and let Ctrl-C reach the child through the terminal's process group) so the
        # driver stops at a batch boundary; subprocess.call would SIGKILL it on KeyboardInterrupt.
        def forward(signum: int, _frame: Any) -> None:
            if signum != signal.SIGINT:
                child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        return child.wait()
    finally:
        os.unlink(fh.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="handoff", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    op = sub.add_parser("operator", help="run the Kubernetes operator")
    op.add_argument("-n", "--namespace", action="append",
                    help="watch this namespace (repeatable); default: HANDOFF_NAMESPACES or all")
    op.add_argument("--standalone", action="store_true", default=True,
                    help="no peering with other operator instances (default; one replica)")
    op.add_argument("--liveness", default=None, help="e.g. http://0.0.0.0:8081/healthz")
    op.set_defaults(func=_operator)
    run = sub.add_parser("run", help="run one StreamTableHandoff locally (Spark local mode)")
    run.add_argument("-f", "--file", required=True, help="StreamTableHandoff manifest (YAML)")
    run.add_argument("--checkpoint", help="checkpoint directory (default ./.handoff/<ns>/<name>/checkpoint)")
    run.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    run.add_argument("--available-now", action="store_true",
                     help="drain what is in the topics now, then exit 0 (Trigger.AvailableNow)")
    run.add_argument("--print-config", action="store_true", help="print the app config and exit")
    run.set_defaults(func=_run)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
