"""The test bed's ports come from below the ephemeral range, where no outgoing connection can take them."""
import socket

from handoff_testbed.proc import ephemeral_range, free_port


def test_free_ports_are_below_the_ephemeral_range_and_bindable():
    low, high = ephemeral_range()
    assert low < high
    ports = {free_port() for _ in range(50)}
    assert all(port < low for port in ports), sorted(ports)
    assert len(ports) > 40  # random picks, not one port handed out over and over
    for port in list(ports)[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_handed_out(monkeypatch):
    """The pick is offered the held ports first: each must be skipped for the next free one."""
    import random

    held = []
    try:
        for _ in range(3):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", free_port()))
            sock.listen()
            held.append(sock)
        taken = [s.getsockname()[1] for s in held]
        offers = iter(taken + [taken[0] + 1 if taken[0] + 1 not in taken else taken[0] + 2])
        monkeypatch.setattr(random, "choice", lambda _candidates: next(offers))
        port = free_port()
        assert port not in taken
        assert port in (taken[0] + 1, taken[0] + 2)
    finally:
        for sock in held:
            sock.close()
