"""Logging that never blocks the request path: records go through a queue to a
listener thread that does the writing. Call ``configure_logging`` from the CLI,
never at import."""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue

__all__ = ["configure_logging"]

_listener: logging.handlers.QueueListener | None = None


def configure_logging(level: str = "INFO", prefix: str = "") -> None:
    """Send milliserve's (and uvicorn's) logs to stderr through a background queue.
    ``prefix`` starts every line (``worker 1``, for the workers of ``serve --workers``)."""
    global _listener
    if _listener is not None:
        _listener.stop()
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    stream = logging.StreamHandler()
    lead = f"{prefix} " if prefix else ""
    stream.setFormatter(logging.Formatter(f"%(asctime)s {lead}%(levelname)s %(name)s: %(message)s"))
    _listener = logging.handlers.QueueListener(records, stream, respect_handler_level=False)
    _listener.start()
    atexit.register(_listener.stop)
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(records)]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.error", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
