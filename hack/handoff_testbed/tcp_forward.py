"""`python -m handoff_testbed.tcp_forward LISTEN_HOST:PORT TARGET_HOST:PORT`: a plain TCP relay.

Why: the test-bed kube-apiserver listens on loopback only, and pods cannot reach the host's loopback.
The node relays from its bridge's gateway address (an address inside the network the test bed made)
to the apiserver's loopback port, and points the `kubernetes` Service's endpoints at the relay, so
in-cluster clients (the operator pod, Spark's driver creating executors) reach the same apiserver.
TLS passes through untouched: the serving certificate already names the Service's ClusterIP.
"""
from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

from .proc import Service, wait_until


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def _serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, upstream_writer), _pipe(upstream_reader, client_writer))

    server = await asyncio.start_server(handle, *listen)
    async with server:
        await server.serve_forever()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def start_relay(listen_host: str, target: str, log: Path, port: int | None = None) -> tuple[Service, int]:
    """Start a relay process from `port` (default: a free one) on `listen_host` to `target` (host:port)."""
    if port is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((listen_host, 0))
            port = int(sock.getsockname()[1])
    service = Service(f"relay-{port}", [sys.executable, "-m", "handoff_testbed.tcp_forward",
                                        f"{listen_host}:{port}", target], log,
                      env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])}).start()

    def listening() -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.2)
            return probe.connect_ex((listen_host, port)) == 0

    wait_until(listening, 20, f"relay {listen_host}:{port} -> {target}", service)
    return service, port


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: tcp_forward LISTEN_HOST:PORT TARGET_HOST:PORT", file=sys.stderr)
        return 2
    asyncio.run(_serve(_address(argv[0]), _address(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
