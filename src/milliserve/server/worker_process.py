"""One worker of ``milliserve serve --workers N`` (``python -m milliserve.server.worker_process``).

The parent (server/workers.py) starts it with its settings and its slot (the inherited
descriptors and ports) as JSON on stdin; it runs a ``Server`` on them until SIGTERM.
Apart from the parent's module because the parent is started by server/assembly.py and this
side builds server/assembly.py's ``Server``: one module holding both made the two import each
other.
"""

from __future__ import annotations

import json
import logging
import sys

from milliserve.config.settings import Settings
from milliserve.errors import ConfigError
from milliserve.observability.logs import configure_logging
from milliserve.server.assembly import Server
from milliserve.server.listeners import WorkerSlot

__all__ = ["worker_main"]

log = logging.getLogger(__name__)


def worker_main() -> None:  # pragma: no cover - runs in the worker processes
    """Read the spec from stdin and serve until SIGTERM; exit code 1 on a ConfigError."""
    spec = json.loads(sys.stdin.buffer.read())
    slot_data = spec["slot"]
    slot_data["peer_ports"] = tuple(slot_data["peer_ports"])
    slot = WorkerSlot(**slot_data)
    settings = Settings(**spec["settings"])
    configure_logging(settings.log_level, prefix=f"worker {slot.index}")
    try:
        import uvloop

        uvloop.run(Server(settings, worker=slot).run_until_signal())
    except ConfigError as exc:
        log.error("%s", exc.message)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    worker_main()
