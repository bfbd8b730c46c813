"""A BigQuery sink with `credentialsFrom`: the operator (in-process, real kube-apiserver) reads the Secret and
reads the table's ledger as that service account — status from the ledger, not the consumer group's
offsets. The service-account key's token_uri points at a small OAuth token endpoint on loopback, which
checks the JWT grant is signed by the key in the Secret and names its account; BigQuery is the emulator."""
from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.parse
import uuid


import pytest
from kubernetes import client

from handoff_spark.bigquery import ledger as bigquery_ledger
from handoff_spark.kafka.offsets import commit_group_offsets

from bq_support import bq_config
from operator_support import Cluster, Operator, base_spec, eventually

pytestmark = [pytest.mark.apiserver, pytest.mark.kafka, pytest.mark.bigquery]

EMAIL = "handoff-status@test-project.iam.gserviceaccount.com"


class TokenEndpoint:
    """OAuth2 token endpoint for the JWT-bearer grant a service-account key makes: verifies the assertion's
    signature with the key's public half and records the account it names."""

    def __init__(self, public_key) -> None:
        self.grants: list[str] = []
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                from google.auth import jwt

                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                assertion = urllib.parse.parse_qs(body)["assertion"][0]
                claims = jwt.decode(assertion, certs=[public_key], verify=True)  # raises if not signed by it
                endpoint.grants.append(claims["iss"])
                out = json.dumps({"access_token": f"token-{len(endpoint.grants)}", "expires_in": 3600,
                                  "token_type": "Bearer"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _key_pair() -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


def test_status_read_from_the_ledger_with_the_credentials_from_secret(cluster: Cluster, kafka, bigquery,
                                                                     tmp_path) -> None:
    private, public = _key_pair()
    tokens = TokenEndpoint(public)
    bootstrap = kafka.bootstrap
    topic = f"creds-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=1)
    ns = cluster.new_namespace("bqcreds")
    dataset = f"ds_{uuid.uuid4().hex[:8]}"
    bigquery.bq_client().create_dataset(f"{bigquery.project}.{dataset}")
    mine = bq_config(tmp_path, bigquery, bootstrap, topic, dataset=dataset, table="events", handoffId=f"{ns}/events")
    commit_us = int(time.time() * 1_000_000)
    assert bigquery_ledger.record_batch(mine, 5, {topic: {"0": [0, 7]}}, 7, 0, int(time.time() * 1000), commit_us)
    # the consumer group says something else, so a fallback to it would show
    eventually(lambda: commit_group_offsets(bootstrap, f"handoff-{ns}.events", {topic: {0: 2}}, timeout_s=10.0),
               "group offsets committed")

    key = {"type": "service_account", "project_id": bigquery.project, "private_key_id": "k1",
           "private_key": private, "client_email": EMAIL, "client_id": "1", "token_uri": tokens.url}
    cluster.core.create_namespaced_secret(ns, client.V1Secret(
        metadata=client.V1ObjectMeta(name="bq-sa"), string_data={"sa.json": json.dumps(key)}))
    spec = base_spec(bootstrap, sink={"bigquery": {
        "project": bigquery.project, "dataset": dataset, "table": "events",
        "restEndpoint": bigquery.rest_endpoint, "grpcEndpoint": bigquery.grpc_endpoint,
        "credentialsFrom": {"name": "bq-sa", "key": "sa.json"}}})
    spec["source"]["topics"] = [topic]

    op = Operator(cluster.kubeconfig, status_interval=1.0)
    op.start()
    try:
        cluster.create(ns, "events", spec)
        status = eventually(lambda: (s := cluster.get(ns, "events").get("status") or {}).get("lag") is not None
                            and (s.get("committed") or {}).get("batch") is not None and s,
                            "status with the ledger's commit")
        assert status["committed"]["batch"] == 5
        assert status["committed"]["snapshot"] == str(commit_us)
        assert status["committed"]["offsets"] == {topic: {"0": 7}}
        assert EMAIL in tokens.grants  # the operator authenticated as the Secret's service account
    finally:
        op.stop()
        tokens.stop()
