"""The test bed's CA and apiserver certificate pass strict X.509 verification (Python 3.13's default).

Debian 13's Python 3.13 verifies with `ssl.VERIFY_X509_STRICT` by default; a chain without key identifiers
failed there, so the apiserver never looked ready. The flag is set by hand here so the check runs on 3.11 too.
"""
from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

from handoff_testbed.k8s_pki import write_pki


def _handshake(pki_dir: Path, server_hostname: str) -> None:
    pki = write_pki(pki_dir, "10.96.0.1")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki.serving_cert, pki.serving_key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            server.wrap_socket(conn, server_side=True).close()
        except (ssl.SSLError, OSError):
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ssl.create_default_context(cafile=str(pki.ca_cert))
    client.verify_flags |= ssl.VERIFY_X509_STRICT
    try:
        with client.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                                server_hostname=server_hostname):
            pass
    finally:
        thread.join(5)
        listener.close()


def test_the_apiserver_certificate_verifies_strictly_by_ip_and_by_name(tmp_path: Path) -> None:
    _handshake(tmp_path / "ip", "127.0.0.1")
    _handshake(tmp_path / "name", "kubernetes.default.svc")
