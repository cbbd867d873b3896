"""The test helpers' own promises."""

from __future__ import annotations

import socket
from contextlib import closing

from milliserve.testing import free_port


def test_free_ports_are_distinct_and_bindable() -> None:
    # the kernel hands a just-closed port out again now and then: across a thousand calls
    # some repeat unless free_port() remembers what it gave (a server and a Redis once got
    # the same port in the tutorial test)
    ports = [free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", ports[-1]))
