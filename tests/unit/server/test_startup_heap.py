"""What loading made is out of the garbage collector's way once the server serves (issue
24, item 5): a full collection walked the whole heap, models and all, 50-70 ms with the
example repository, and every client waited that long. With model control, a model may be
unloaded, so nothing is frozen.

The server runs in a child process (freezing this test process would keep every later
test's cycles alive); it reports its frozen-object count once ready, then stops itself."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

CHILD = """
import asyncio, gc, os, signal, sys
from pathlib import Path
from milliserve.config.settings import GrpcSettings, HttpSettings, MetricsSettings, Settings
from milliserve.server.assembly import Server

settings = Settings(
    model_repository=Path(sys.argv[1]),
    model_control_mode=sys.argv[2],
    http=HttpSettings(enabled=False),
    grpc=GrpcSettings(enabled=False),
    metrics=MetricsSettings(enabled=False),
)
server = Server(settings)

async def main():
    async def report():
        while not server.dataplane.started:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)  # run_until_signal goes on after start()
        print("frozen", gc.get_freeze_count(), flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
    task = asyncio.create_task(report())
    await server.run_until_signal()
    await task

asyncio.run(main())
"""


@pytest.mark.parametrize(("mode", "frozen"), [("none", True), ("explicit", False)])
def test_the_startup_heap_is_frozen_once_the_server_serves(
    tmp_path: Path, write_add_sub: Callable[..., Path], mode: str, frozen: bool
) -> None:
    write_add_sub(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), mode], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    count = int(done.stdout.split("frozen", 1)[1].split()[0])
    assert (count > 10_000) if frozen else count == 0, (count, done.stdout)
