"""A transport for driving an HTTP/1.1 protocol in-process: it records what is written and
answers the little else a protocol asks of a transport."""

from __future__ import annotations

from typing import Any


class Transport:
    """What the protocol writes (``out``), and the little else it asks of a transport."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closing = False

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
        self.closing = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass
