"""The set of models a server knows, their states, and load / reload / unload.

A reload builds the new versions beside the old ones and swaps them in one step
on the event loop; the old versions then drain their queues before they close.
Requests that were already queued finish on the old version, new ones go to
the new version, and none fails. A model that fails to load is marked
UNAVAILABLE with the reason; a failed *reload* keeps the old versions serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from milliserve.backends.registry import generative_backend_for
from milliserve.cache.response_cache import CacheFactory
from milliserve.config.model_config import ModelConfig, config_path
from milliserve.errors import BackendError, ConfigError, ModelNotReadyError, NotFoundError, shown
from milliserve.llm.generative_servable import GenerativeServable
from milliserve.pipeline.ensemble import PipelineRuntime
from milliserve.repository.on_demand import OnDemand, resident_bytes
from milliserve.repository.overrides import LoadOverride, parse_override
from milliserve.repository.repository import Repository, valid_model_name, versions_in
from milliserve.runtime.executor import Executor
from milliserve.runtime.model_runtime import ModelRuntime
from milliserve.runtime.servable import Servable

Runtime = Servable

__all__ = ["ModelRegistry", "ModelState"]

log = logging.getLogger(__name__)


class ModelState:
    READY = "READY"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(slots=True)
class _Entry:
    name: str
    state: str = ModelState.UNAVAILABLE
    reason: str = ""
    versions: dict[str, Runtime] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    override: LoadOverride | None = None  # the load request's config and files it serves

    def latest(self) -> Runtime | None:
        versions = self.versions
        if len(versions) == 1:  # the common case, on every request
            for rt in versions.values():
                return rt
        if not versions:
            return None
        return versions[max(versions, key=int)]


class ModelRegistry:
    """Loads models from a Repository and hands out ready ModelRuntimes."""

    def __init__(
        self,
        repository: Repository,
        executor: Executor,
        caches: CacheFactory | None = None,
        expose_names: bool = False,
        llm_memory_mib: int = 0,
    ) -> None:
        self.repository = repository
        # generative models loaded on demand under this cap (repository/on_demand.py)
        self.on_demand = OnDemand(llm_memory_mib << 20) if llm_memory_mib > 0 else None
        self._executor = executor
        self.caches = caches or CacheFactory()
        # whether a 404 may list the models this server has (off: a client learns nothing
        # about the repository it did not ask for)
        self.expose_names = expose_names
        self._entries: dict[str, _Entry] = {}
        self._resolving: set[str] = set()  # pipelines whose dependencies are being loaded

    def _entry(self, name: str, override: LoadOverride | None = None) -> _Entry:
        entry = self._entries.get(name)
        if entry is None:
            if not (override is not None and override.files and valid_model_name(name)):
                self.repository.model_dir(name)  # NotFoundError for unknown names
            entry = self._entries[name] = _Entry(name)
        return entry

    async def load(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Load or reload a model: from the repository, or with the overrides a load request's
        ``parameters`` carry (``config``, ``file:...``; with files the model need not be in
        the repository). Raises RequestError for bad overrides, ConfigError/BackendError for a
        model that does not load (after recording them)."""
        override = parse_override(name, parameters) if parameters else None
        entry = self._entries.get(name)
        cold = entry is None or not entry.versions
        if override is None and cold and self.on_demand is not None and self.is_generative(name):
            await self._load_on_demand(name)  # under the cap, as a request's load
            return
        await self._load(name, override)

    async def _load(self, name: str, override: LoadOverride | None) -> None:
        entry = self._entry(name, override)
        async with entry.lock:
            had_versions = bool(entry.versions)
            if not had_versions:
                entry.state, entry.reason = ModelState.LOADING, ""
            try:
                if override is not None and override.files:
                    model_dir = await self._executor.run_load(override.write, name)
                else:
                    model_dir = self.repository.model_dir(name)
                config = override.config if override is not None else self.repository.read_config(name)
                new = await self._build(name, model_dir, config)
            except (ConfigError, BackendError) as exc:
                if override is not None:
                    override.discard()
                if had_versions:
                    log.error("reload of %s failed, still serving the old versions: %s", name, exc)
                else:
                    entry.state, entry.reason = ModelState.UNAVAILABLE, self.repository.relative(exc.message)
                    log.error("model %s failed to load: %s", name, exc)
                raise
            old, old_override = entry.versions, entry.override
            entry.versions, entry.state, entry.reason = new, ModelState.READY, ""
            entry.override = override
        for runtime in old.values():
            await runtime.close()
        if old_override is not None and old_override is not override:
            old_override.discard()

    async def _build(self, name: str, model_dir: Path, config: ModelConfig | None) -> dict[str, Runtime]:
        available = versions_in(model_dir)
        policy = config.version_policy if config else None
        chosen = policy.select(available) if policy else available[-1:]
        if config is not None and config.ensemble_scheduling is not None:
            return await self._build_pipeline(config, chosen or [1])  # its version folders may be absent
        if not chosen:
            raise ConfigError(
                f"{model_dir}: no version to serve (version folders: "
                f"{available}; version_policy selects none)"
            )
        built: dict[str, Runtime] = {}
        where = str(config_path(model_dir))
        try:
            for v in chosen:
                vdir = model_dir / str(v)
                if generative_backend_for(config, vdir, where) is not None:
                    built[str(v)] = await GenerativeServable.load(config, name, str(v), vdir, self._executor)
                    continue
                built[str(v)] = await ModelRuntime.load(
                    config, name, str(v), vdir, self._executor, self.caches
                )
        except BaseException:
            for rt in built.values():
                await rt.close()
            raise
        return built

    async def _build_pipeline(self, config: ModelConfig, versions: list[int]) -> dict[str, Runtime]:
        """Load the models a pipeline calls (if they are not loaded yet), then the pipeline."""
        assert config.ensemble_scheduling is not None
        name = config.name
        if name in self._resolving:
            raise ConfigError(f"pipeline {name!r} calls itself through {sorted(self._resolving)}")
        self._resolving.add(name)
        try:
            for i, step in enumerate(config.ensemble_scheduling.step, 1):
                for dep, role in step.roles():
                    if dep in self._entries and self._entries[dep].versions:
                        continue
                    # "model 'm_b' (step 2's hedge replica of 'm')"
                    what = f"model {dep!r}" + (f" (step {i}'s {role})" if role else "")
                    try:
                        await self.load(dep)
                    except NotFoundError:
                        raise ConfigError(
                            f"pipeline {name!r} calls {what}, which is not in the repository"
                        ) from None
                    except (ConfigError, BackendError) as exc:
                        raise ConfigError(
                            f"pipeline {name!r} calls {what}, which failed to load: {exc.message}"
                        ) from None
        finally:
            self._resolving.discard(name)
        model_dir = self.repository.model_dir(name)
        built: dict[str, Runtime] = {}
        for v in versions:
            built[str(v)] = await PipelineRuntime.load(
                config, str(v), model_dir, self.get, self.caches, self._executor.offload
            )
        return built

    async def load_all(self, names: list[str] | None = None) -> None:
        """Load several models at start-up; a failure is recorded and the others still load.
        A model that a pipeline already loaded as its dependency is not loaded again, and
        generative models load on demand when ``llm_memory_mib`` is set."""
        for name in names if names is not None else self.repository.model_names():
            entry = self._entries.get(name)
            if entry is not None and entry.versions:
                continue
            if self.on_demand is not None and self.is_generative(name):
                log.info("model %s loads on its first request (llm_memory_mib)", name)
                continue
            try:
                await self.load(name)
            except (ConfigError, BackendError):
                pass  # recorded in the index and logged by load()
            except NotFoundError as exc:
                log.error("cannot load %r: %s", name, exc)

    # ---- generative models on demand (repository/on_demand.py) ----
    def is_generative(self, name: str) -> bool:
        """Whether the repository's model ``name`` is served by a generative backend (its
        latest version folder's, as the config says)."""
        try:
            model_dir = self.repository.model_dir(name)
            config = self.repository.read_config(name)
            versions = versions_in(model_dir)
            if not versions or (config is not None and config.ensemble_scheduling is not None):
                return False
            where = str(config_path(model_dir))
            return generative_backend_for(config, model_dir / str(versions[-1]), where) is not None
        except (ConfigError, NotFoundError, OSError):
            return False

    def on_demand_models(self) -> dict[str, bool]:
        """With ``llm_memory_mib``: every generative model of the repository, and whether it
        is loaded (``GET /v1/models``). Empty without it."""
        if self.on_demand is None:
            return {}
        names = [n for n in self.repository.model_names() if self.is_generative(n)]
        return {n: bool(n in self._entries and self._entries[n].versions) for n in names}

    def _loaded_generative(self) -> list[str]:
        return [
            n
            for n, e in self._entries.items()
            if e.versions and any(isinstance(rt, GenerativeServable) for rt in e.versions.values())
        ]

    def _busy(self, name: str) -> bool:
        """A model with requests running or waiting, or used within the last second (a
        request may hold it between looking it up and handing its work to the engine)."""
        entry = self._entries.get(name)
        if entry is None:
            return False
        od = self.on_demand
        recent = od is not None and name in od.models and time.monotonic() - od.models[name].last_used < 1.0
        return recent or any(rt.stats.pending() for rt in entry.versions.values())

    async def ensure_loaded(self, name: str) -> None:
        """With ``llm_memory_mib``: load the generative model ``name`` if it is not loaded,
        unloading idle ones (least recently used first) to keep under the cap, and mark it
        used. Nothing for other models, or without the cap (``get`` says why not)."""
        od = self.on_demand
        if od is None:
            return
        entry = self._entries.get(name)
        if entry is not None and entry.versions:
            od.touch(name)
            return
        if not self.is_generative(name):
            return
        arrival = time.perf_counter()
        if not await self._load_on_demand(name):
            return
        loaded = time.perf_counter()
        for rt in self._entries[name].versions.values():
            if isinstance(rt, GenerativeServable):  # its next request: a cold start
                rt.loaded_on_demand(arrival, loaded - arrival)
        log.info("loaded %s on demand in %.2f s", name, loaded - arrival)

    async def _load_on_demand(self, name: str) -> bool:
        """Load the generative model ``name`` under the cap: room made, its size measured.
        False when another load did it meanwhile."""
        od = self.on_demand
        assert od is not None
        async with od.lock:  # one load at a time: a model is never loaded twice
            entry = self._entries.get(name)
            if entry is not None and entry.versions:
                od.touch(name)
                return False
            need = od.expected(name, self.repository.model_dir(name))
            # a model loaded before the cap was set has not been measured: its files' size
            size = lambda n: od.expected(n, self.repository.model_dir(n))  # noqa: E731
            await od.make_room(name, need, self._loaded_generative, size, self._busy, self.unload)
            before = resident_bytes()
            await self._load(name, None)
            od.measured(name, resident_bytes() - before)
            od.touch(name)
        for rt in self._entries[name].versions.values():
            if isinstance(rt, GenerativeServable):
                rt.gen_stats.resident_bytes = od.models[name].measured
        return True

    async def unload(self, name: str) -> None:
        entry = self._entry(name)
        async with entry.lock:
            old = entry.versions
            entry.state, entry.reason, entry.versions = ModelState.UNLOADING, "", {}
            for runtime in old.values():
                await runtime.close()
            entry.state, entry.reason = ModelState.UNAVAILABLE, "unloaded"
            if entry.override is not None:
                entry.override.discard()
                entry.override = None

    async def close(self) -> None:
        for name in list(self._entries):
            await self.unload(name)

    def get(self, name: str, version: str = "") -> Runtime:
        """The runtime that serves ``name`` (and ``version``, "" = latest).

        Raises NotFoundError for an unknown model or version, ModelNotReadyError
        for a model that is not ready.
        """
        entry = self._entries.get(name)
        if entry is None:
            # Triton's words: its clients (and their examples) look for them
            known = f" (this server has {sorted(self._entries)})" if self.expose_names else ""
            raise NotFoundError(f"Request for unknown model: {shown(name)} is not found{known}")
        if version and not (version.isascii() and version.isdigit()):
            raise NotFoundError(
                f"failed to get model version from specified version string {shown(version)} "
                "(use only digits)"
            )
        if not entry.versions:
            why = f": {entry.reason}" if entry.reason else ""
            raise ModelNotReadyError(f"model {name!r} is not ready ({entry.state}{why})")
        if not version:
            rt = entry.latest()
            assert rt is not None
            return rt
        rt = entry.versions.get(version)
        if rt is None:
            raise NotFoundError(
                f"Request for unknown model: {name!r} version {version} is not found "
                f"(serving versions {sorted(entry.versions, key=int)})"
            )
        return rt

    def versions(self, name: str) -> list[str]:
        entry = self._entries.get(name)
        return sorted(entry.versions, key=int) if entry else []

    def all_ready(self) -> list[Runtime]:
        return [rt for e in self._entries.values() for rt in e.versions.values()]

    def is_loading(self) -> bool:
        return any(e.state == ModelState.LOADING for e in self._entries.values())

    def unavailable(self) -> list[str]:
        """Models that should serve and cannot: they failed to load (not those unloaded on
        purpose through the repository API)."""
        return sorted(
            n
            for n, e in self._entries.items()
            if e.state == ModelState.UNAVAILABLE and e.reason != "unloaded"
        )

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: every model on disk with its state."""
        rows: list[dict[str, Any]] = []
        for name in sorted(set(self.repository.model_names()) | set(self._entries)):
            entry = self._entries.get(name)
            if entry and entry.versions:
                rows.extend(
                    {"name": name, "version": v, "state": ModelState.READY, "reason": ""}
                    for v in sorted(entry.versions, key=int)
                )
            elif not ready_only:
                row: dict[str, Any] = {"name": name}
                if entry:
                    row["state"] = entry.state
                    row["reason"] = entry.reason
                rows.append(row)
        return rows
