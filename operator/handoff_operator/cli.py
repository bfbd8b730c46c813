"""`handoff` console script.

- `handoff operator`: run the operator with settings from the environment (HANDOFF_NAMESPACES,
  HANDOFF_LOG_LEVEL, HANDOFF_METRICS_PORT, HANDOFF_STATUS_INTERVAL, ...); same as
  `kopf run -m handoff_operator` plus the Prometheus endpoint and namespace selection.
- `handoff replay -f handoff.yaml -r replay.yaml`: a ReplayRequest against a locally run handoff's table
  (plan, undo tag, rollback, gap), as the operator does it; the user stops and restarts `handoff run`.
- `handoff run -f handoff.yaml`: run one StreamTableHandoff locally (Spark local mode) by rendering its
  app config exactly as the operator would and becoming the data plane's entry point
  (`exec python -m handoff_spark run --config ...`: one process, so a `kill -9` or a closed terminal leaves no
  driver behind that keeps writing).
- `handoff ledger show|accept-kafka -f handoff.yaml`: the handoff's ledger, read from its table; record that a
  recreated topic/cluster is accepted (see handoff_spark.entry).
- `handoff timeline -f handoff.yaml [--since 2h] [-o text|json|yaml] [--watch]`: `kubectl handoff timeline`'s rows
  for a handoff run locally, from the one source a local run has, the table's ledger (commits with their snapshot
  and offsets, dead letters, dropped duplicates, late records, gaps a local `handoff replay` recorded, epochs);
  `--watch` keeps printing rows as the ledger gains them.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from handoff_spark import contract


def _operator(args: argparse.Namespace) -> int:
    import kopf

    from handoff_operator import register_handlers
    from handoff_operator.runtime import metrics
    from handoff_operator.runtime.settings import OperatorSettings, use_settings

    register_handlers()
    settings = OperatorSettings()
    if args.namespace:
        settings = settings.model_copy(update={"namespaces": list(args.namespace)})
    use_settings(settings)
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
    from handoff_operator.spec.render import app_config
    from handoff_operator.spec.validation import parse_spec

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


def local_checkpoint_env(manifest: dict[str, Any]) -> dict[str, str]:
    """The settings of an s3a:// or gs:// spec.checkpoint as the driver pod gets them (render.checkpoint_env), for
    a local run: the values, not the Secret's keys or the pod's key file, which are not resolved locally
    (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or GOOGLE_APPLICATION_CREDENTIALS, come from the shell, as
    propertiesFrom's values do from the properties)."""
    from handoff_operator.spec.render import checkpoint_env
    from handoff_operator.spec.validation import parse_spec

    spec, _ = parse_spec(manifest.get("spec") or {})
    if spec is None:
        return {}
    return {e["name"]: e["value"] for e in checkpoint_env(spec)
            if "value" in e and e["name"] not in (contract.ENV_CHECKPOINT_CREDENTIALS_SECRET,
                                                  contract.ENV_GOOGLE_APPLICATION_CREDENTIALS)}


def _manifest(path: str) -> dict[str, Any]:
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"{path}: cannot read the manifest: {exc}") from None
    manifests = [d for d in docs if isinstance(d, dict) and d.get("kind") == "StreamTableHandoff"]
    if len(manifests) != 1:
        raise SystemExit(f"{path}: expected exactly one StreamTableHandoff, found {len(manifests)}")
    return manifests[0]


#: `handoff run`'s app config is written to `<tmp>/handoff-run-<pid>-<random>/app.json` (`driver.temp_dirs.own_temp_dir`):
#: the pid is the driver's too (exec), so the next `handoff run` removes it once this one has exited or was killed.
RUN_DIR_PREFIX = "handoff-run-"


def _port(text: str) -> int:
    """`--metrics-port`'s value: a TCP port, or 0 for any free one."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: use 0..65535 (0: any free port)")
    return port


def _run(args: argparse.Namespace) -> int:
    manifest = _manifest(args.file)
    text = local_config(manifest, args.checkpoint, args.master)
    if args.metrics_port is not None:  # the port asked for, or a clear failure if it is taken
        doc = json.loads(text)
        doc["metricsPort"] = args.metrics_port
        text = json.dumps(doc, indent=2)
    # else the rendered default (the pods' fixed port): taken by another local run, any free one, printed
    if args.print_config:
        print(text)
        return 0
    from handoff_spark.entry import own_temp_dir

    config = Path(own_temp_dir(RUN_DIR_PREFIX)) / contract.APP_CONFIG_FILE
    config.write_text(text)
    if args.checkpoint is None:  # the spec's s3a:// or gs:// checkpoint's settings (the shell's win)
        for name, value in local_checkpoint_env(manifest).items():
            os.environ.setdefault(name, value)
    sys.stdout.flush()
    # exec, not a child: signals reach the driver directly (SIGTERM/Ctrl-C stop it at a batch boundary) and
    # nothing is orphaned when this process is killed.
    os.execv(sys.executable, contract.run_command(sys.executable, str(config), available_now=args.available_now,
                                                  metrics_port_fallback=args.metrics_port is None))
    return 0  # not reached


def _ledger(args: argparse.Namespace) -> int:
    from handoff_spark.config import AppConfig
    from handoff_spark.entry import accept_kafka, ledger_show

    cfg = AppConfig.model_validate_json(local_config(_manifest(args.file), args.checkpoint, "local[1]"))
    if args.ledger_command == "show":
        print(ledger_show(cfg, args.output, args.limit))
        return 0
    result = accept_kafka(cfg)
    if not result["recorded"]:
        print("the ledger already matches Kafka's cluster and topic ids: nothing recorded")
    else:
        print(f"recorded epoch {result['entry']}: {result['reason']}")
    return 0


def _timeline(args: argparse.Namespace) -> int:
    import time

    from handoff_spark.config import AppConfig
    from handoff_spark.ledger import entries

    from handoff_operator import yaml_text
    from handoff_operator.kubectl_plugin import timeline
    from handoff_operator.kubectl_plugin.output import print_document

    cfg = AppConfig.model_validate_json(local_config(_manifest(args.file), args.checkpoint, "local[1]"))
    try:
        since = timeline.parse_since(args.since, int(time.time() * 1000))
    except ValueError:
        raise SystemExit(f"--since {args.since!r}: use a duration such as 90s, 15m, 2h or 7d") from None
    bigquery = cfg.sink.kind == "bigquery"

    def read() -> list[dict[str, Any]]:
        return timeline.rows(entries(cfg), (), (), cfg.handoff_id, since, None, (), bigquery)

    shown = read()
    print_document(shown[:args.limit], args.output, timeline.format_text)
    if not args.watch:
        return 0
    # Followed: each new row once, oldest first, as `kubectl get -w` adds lines (json: one document per line,
    # yaml: one `---` document per row).
    seen = {(r["timeMs"], r["what"]) for r in shown}
    try:
        while True:
            sys.stdout.flush()
            time.sleep(args.interval)
            for r in [r for r in reversed(read()) if (r["timeMs"], r["what"]) not in seen]:
                seen.add((r["timeMs"], r["what"]))
                if args.output == "json":
                    print(json.dumps(r, default=str))
                elif args.output == "yaml":
                    print("---\n" + yaml_text.dump(r, sort_keys=False, default_flow_style=False), end="")
                else:
                    print(timeline.format_text([r]))
    except KeyboardInterrupt:
        return 0


def _replay(args: argparse.Namespace) -> int:
    import yaml

    from handoff_spark.config import AppConfig

    from handoff_operator.replay.local import replay

    cfg = AppConfig.model_validate_json(local_config(_manifest(args.file), args.checkpoint, "local[1]"))
    try:
        docs = [d for d in yaml.safe_load_all(Path(args.request).read_text()) if d]
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"{args.request}: cannot read the manifest: {exc}") from None
    requests = [d for d in docs if isinstance(d, dict) and d.get("kind") == "ReplayRequest"]
    if len(requests) != 1:
        raise SystemExit(f"{args.request}: expected exactly one ReplayRequest, found {len(requests)}")
    return replay(cfg, requests[0])


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
    run.add_argument("--metrics-port", type=_port, default=None,
                     help="serve Prometheus metrics on this port, or fail if it is taken (0: any free port); "
                          "default: the operator's port, or any free one when another process holds it")
    run.set_defaults(func=_run)
    led = sub.add_parser("ledger", help="read a handoff's ledger from its table, or record an accepted change")
    led.add_argument("ledger_command", choices=["show", "accept-kafka"],
                     help="show: entries newest first; accept-kafka: accept a recreated topic/cluster")
    led.add_argument("-f", "--file", required=True, help="StreamTableHandoff manifest (YAML)")
    led.add_argument("--checkpoint", help="checkpoint directory (as for `handoff run`)")
    led.add_argument("-o", "--output", choices=["text", "json"], default="text")
    led.add_argument("--limit", type=int, default=None, help="newest N entries only")
    led.set_defaults(func=_ledger)
    tl = sub.add_parser("timeline", help="what happened to a locally run handoff's table, newest first (the "
                                         "ledger's commits, gaps and epochs)")
    tl.add_argument("-f", "--file", required=True, help="StreamTableHandoff manifest (YAML)")
    tl.add_argument("--checkpoint", help="checkpoint directory (as for `handoff run`)")
    tl.add_argument("--since", default=None, help="only rows this recent: 90s, 15m, 2h, 7d")
    tl.add_argument("--limit", type=int, default=None, help="newest N rows only")
    tl.add_argument("-o", "--output", choices=["text", "json", "yaml"], default="text")
    tl.add_argument("-w", "--watch", action="store_true",
                    help="after the rows, keep printing new ones as the ledger gains them (Ctrl-C ends)")
    tl.add_argument("--interval", type=float, default=2.0, help="seconds between reads with --watch (default 2)")
    tl.set_defaults(func=_timeline)
    rep = sub.add_parser("replay", help="run a ReplayRequest against a locally run handoff's table (stop "
                                        "`handoff run` first, start it again after)")
    rep.add_argument("-f", "--file", required=True, help="StreamTableHandoff manifest (YAML)")
    rep.add_argument("-r", "--request", required=True, help="ReplayRequest manifest (YAML)")
    rep.add_argument("--checkpoint", help="checkpoint directory (as for `handoff run`)")
    rep.set_defaults(func=_replay)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
