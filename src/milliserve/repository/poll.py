"""``--model-control-mode poll``: follow the model repository's changes, as Triton's POLL
mode does. Every ``interval_s`` the repository is read (off the event loop): a new model
folder is loaded, a removed one unloaded, and a model whose files changed (config, version
folders, any file's size or time) loaded again; a failed reload keeps the old versions
serving (the registry's rule). As Triton warns, there is no synchronisation with whoever
edits the repository: a poll may see a change half made, and the next one corrects it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from milliserve.errors import MilliserveError
from milliserve.repository.model_registry import ModelRegistry
from milliserve.road import Offload

__all__ = ["RepositoryPoller", "fingerprint"]

log = logging.getLogger(__name__)

Fingerprint = tuple[tuple[str, int, int], ...]
# files looked at per model: a repository that holds more (a dataset by mistake) is still
# polled, from what the first ones say
MAX_FILES = 10_000


def fingerprint(model_dir: Path) -> Fingerprint:
    """What a model folder holds: (relative path, size, modification time) of its files."""
    rows: list[tuple[str, int, int]] = []
    for top, dirs, files in os.walk(model_dir):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(top, name)
            try:
                st = os.stat(path)
            except OSError:  # removed while we looked
                continue
            rows.append((os.path.relpath(path, model_dir), st.st_size, st.st_mtime_ns))
            if len(rows) >= MAX_FILES:
                return tuple(rows)
    return tuple(rows)


class RepositoryPoller:
    """Polls a registry's repository and loads, reloads and unloads to follow it."""

    def __init__(self, registry: ModelRegistry, interval_s: float, offload: Offload) -> None:
        """``offload`` runs the blocking scan off the event loop (the executor's load pool)."""
        self.registry = registry
        self.interval_s = interval_s
        self._offload = offload
        self.seen: dict[str, Fingerprint] = {}
        self.polls = 0

    def scan(self) -> dict[str, Fingerprint]:
        """Every model folder of the repository with its fingerprint (blocking)."""
        repo = self.registry.repository
        return {name: fingerprint(repo.root / name) for name in repo.model_names()}

    async def start(self) -> None:
        """Record what the repository holds now (the models just loaded from it)."""
        self.seen = await self._offload(self.scan)

    async def poll_once(self) -> list[str]:
        """Apply the repository's changes since the last poll; returns what changed."""
        now = await self._offload(self.scan)
        changed: list[str] = []
        for name in sorted(set(self.seen) - set(now)):
            log.info("poll: model %s left the repository: unloading it", name)
            await self.registry.unload(name)
            changed.append(name)
        for name in sorted(now):
            if self.seen.get(name) == now[name]:
                continue
            log.info("poll: model %s is new or changed: loading it", name)
            try:
                await self.registry.load(name)
            except MilliserveError as exc:  # recorded in the index by the registry
                log.warning("poll: model %s did not load: %s", name, exc)
            changed.append(name)
        self.seen = now
        self.polls += 1
        return changed

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll_once()
            except Exception:  # a poll that fails (a folder gone mid-read) is retried next time
                log.exception("poll of the model repository failed")
