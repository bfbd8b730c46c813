"""The Spark settings the operator gives a driver whose UI Ingress has a path other than `/` (spec.spark.ui.ingress,
render.ui_proxy_conf), against the driver's own Spark: taken from the rendered Deployment's PYSPARK_SUBMIT_ARGS
and started the way the driver starts (pyspark launching the JVM with them), the UI's links start with the path,
Spark's redirects go to the Ingress's URL under the path, and Spark still answers at `/` only: which is why the
ingress controller must strip the prefix (docs/operator.md "An Ingress to the UI")."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from typing import Any

from handoff_operator.spec.render import render
from handoff_operator.spec.validation import check, parse_spec

#: Run in a fresh interpreter: the JVM reads PYSPARK_SUBMIT_ARGS once, at its launch. Redirects are not followed, so
#: the Location Spark answers with is what is seen.
_PROBE = """
import json, sys, urllib.error, urllib.request
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").getOrCreate()
url = spark.sparkContext.uiWebUrl
class Keep(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
opener = urllib.request.build_opener(Keep)
out = {}
for path in sys.argv[1:]:
    try:
        with opener.open(url + path, timeout=30) as r:
            out[path] = [r.status, r.headers.get("Location"), r.read().decode()]
    except urllib.error.HTTPError as e:
        out[path] = [e.code, e.headers.get("Location"), ""]
spark.stop()
print(json.dumps(out))
"""


def _ui_submit_args(ingress: dict[str, Any]) -> list[str]:
    """The `--conf spark.ui.*` arguments of the driver the operator renders for a handoff with this ingress."""
    raw = {"source": {"bootstrapServers": "k:9092", "topics": ["t"]}, "sink": {"iceberg": {"table": "db.t"}},
           "spark": {"ui": {"ingress": ingress}}}
    spec, problems = parse_spec(raw)
    assert spec is not None, problems
    resolved, problems = check("orders", spec, {})
    assert not problems, problems
    rendered = render({"metadata": {"name": "orders", "namespace": "shop", "uid": "u"}}, spec, "img:1", resolved)
    (container,) = rendered.child("Deployment")["spec"]["template"]["spec"]["containers"]
    args = shlex.split(next(e["value"] for e in container["env"] if e["name"] == "PYSPARK_SUBMIT_ARGS"))
    pairs = [(args[i], args[i + 1]) for i in range(len(args) - 1) if args[i] == "--conf"]
    return [a for flag, value in pairs if value.startswith("spark.ui.") for a in (flag, value)]


def _probe(submit_args: list[str], *paths: str) -> dict[str, list[Any]]:
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": shlex.join([*submit_args, "--conf", "spark.ui.port=0",
                                                            "pyspark-shell"])}
    out = subprocess.run([sys.executable, "-c", _PROBE, *paths], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_path_prefix_makes_sparks_links_and_redirects_go_through_the_ingress() -> None:
    args = _ui_submit_args({"host": "spark.example.com", "path": "/spark/orders",
                            "tls": {"secretName": "spark-example-tls"}})
    assert args == ["--conf", "spark.ui.proxyBase=/spark/orders",
                    "--conf", "spark.ui.proxyRedirectUri=https://spark.example.com"]
    seen = _probe(args, "/", "/jobs/", "/spark/orders/jobs/")
    status, _, page = seen["/jobs/"]
    assert status == 200
    # Every link of the page, its style sheets and scripts included, is under the Ingress's path.
    assert 'href="/spark/orders/static/' in page and 'src="/spark/orders/static/' in page
    assert 'href="/static/' not in page and 'src="/static/' not in page
    # Spark's own redirect from its root lands on the Ingress's URL, under the path.
    assert seen["/"][:2] == [302, "https://spark.example.com/spark/orders/jobs/"]
    # Spark does not serve under the prefix itself: the controller must strip it.
    assert seen["/spark/orders/jobs/"][0] == 302


def test_at_the_root_spark_is_left_as_it_is() -> None:
    assert _ui_submit_args({"host": "orders-ui.example.com"}) == []


def test_a_regex_path_gives_spark_the_same_literal_prefix() -> None:
    """ingress-nginx strips the prefix with a regex path (and rewrite-target): Spark gets its literal part."""
    assert _ui_submit_args({"host": "spark.example.com", "path": "/spark/orders(/|$)(.*)",
                            "pathType": "ImplementationSpecific"}) == [
        "--conf", "spark.ui.proxyBase=/spark/orders", "--conf", "spark.ui.proxyRedirectUri=http://spark.example.com"]
