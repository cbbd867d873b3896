"""A transport for driving an HTTP/1.1 protocol in-process: it records what is written and
answers the little else a protocol asks of a transport."""

from __future__ import annotations

import asyncio
from typing import Any


class Transport:
    """What the protocol writes (``out``), and the little else it asks of a transport."""

    def __init__(self, protocol: Any = None) -> None:
        """With ``protocol``, closing the transport tells it the connection is lost (soon
        after, in the running loop), as an asyncio transport does: a server that closes its
        idle connections when it stops sees them go instead of waiting out its grace."""
        self.out: list[bytes] = []
        self.closing = False
        self.protocol = protocol

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        if self.protocol is not None:
            try:
                asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)
            except RuntimeError:  # outside a loop: at once
                self.protocol.connection_lost(None)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass
