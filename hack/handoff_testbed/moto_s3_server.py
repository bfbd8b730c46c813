"""moto's S3 server, run as `moto_server` runs it, with one HTTP fix: a single `100 Continue` per request.

Why: Werkzeug's request handler answers `Expect: 100-continue` twice, once in Python's http.server
(`handle_expect_100`, while parsing the request) and once in its own `run_wsgi`. The AWS SDK for Java v2 sends
that header on a PUT of a file (Hadoop S3A uploading RocksDB's state files, `copyFromLocalFile`) and takes the
second `100` as the final answer: S3A's upload failed with "Status Code: 100" and a dedupe's first state commit
with it. Real S3 sends one. This is the one module that touches moto's internals (its WSGI app and handler).

Run: `python -m handoff_testbed.moto_s3_server -H 127.0.0.1 -p PORT`.
"""
from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple


class OneContinueRequestHandler(MotoRequestHandler):  # type: ignore[misc]
    """Leaves the `100 Continue` to Werkzeug's `run_wsgi`, which sends it once the request is parsed."""

    def handle_expect_100(self) -> bool:
        return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)

    def stop(signum: int, frame: Any) -> None:
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(args.host, args.port, app, threaded=True, request_handler=OneContinueRequestHandler)


if __name__ == "__main__":
    main()
