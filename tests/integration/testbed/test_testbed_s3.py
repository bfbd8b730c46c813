"""The test bed's S3 (moto behind handoff_testbed.moto_s3_server) answers `Expect: 100-continue` with exactly one
`100 Continue` before its final response, as S3 does. Werkzeug's handler sent two, and the AWS SDK for Java v2
(Hadoop S3A uploading RocksDB's state files) took the second as the answer: "Status Code: 100"."""
from __future__ import annotations

import socket
import uuid
from typing import Any


def _put_expecting_continue(port: int, path: str, body: bytes) -> tuple[bytes, bytes]:
    """What the server sends before the body (the interim answer), and everything after it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(body)}\r\n"
                     "Expect: 100-continue\r\nConnection: close\r\n\r\n".encode())
        interim = b""
        while not interim.endswith(b"\r\n\r\n"):
            chunk = sock.recv(1)
            assert chunk, f"connection closed before an interim answer: {interim!r}"
            interim += chunk
        sock.sendall(body)
        rest = b""
        while chunk := sock.recv(65536):
            rest += chunk
    return interim, rest


def test_a_put_expecting_continue_gets_one_100_then_its_answer(s3: Any) -> None:
    bucket = f"continue-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    interim, rest = _put_expecting_continue(s3.port, f"/{bucket}/key", b"hello")
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert rest.startswith(b"HTTP/1.1 200"), rest[:200]
    assert s3.client().get_object(Bucket=bucket, Key="key")["Body"].read() == b"hello"
