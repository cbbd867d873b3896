"""The transport-agnostic request path shared by the HTTP and gRPC front ends.

Front ends translate the wire to protocol types, call one method here, and map
the errors of ``milliserve.errors`` to their status codes. Nothing here knows
about HTTP or gRPC.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from milliserve._version import __version__
from milliserve.config.model_config import ModelConfig
from milliserve.errors import InvalidInputError, MilliserveError, ModelControlDisabledError, RequestError
from milliserve.protocol.types import InferRequest, InferResponse
from milliserve.runtime.embedding import Embedder, EmbeddingSpec, embedding_spec
from milliserve.runtime.scoring import Classifier, Reranker, classify_spec, rerank_spec
from milliserve.runtime.servable import RoadServable, Servable, ServableRegistry
from milliserve.runtime.soon import Soon
from milliserve.runtime.stats import merge_statistics

__all__ = ["EXTENSIONS", "DataPlane"]

EXTENSIONS = (
    "binary_tensor_data",
    "model_configuration",
    "statistics",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "sequence",
    "sequence(string_id)",
    "generate",
)


class DataPlane:
    """Health, metadata, inference, statistics and repository control."""

    def __init__(
        self, registry: ServableRegistry, model_control: bool, strict_readiness: bool = True
    ) -> None:
        self.registry = registry
        self.model_control = model_control
        self.strict_readiness = strict_readiness
        self.started = False
        self.stopping = False
        # what ServerMetadata lists; the server adds the ones its settings turn on
        self.extensions = list(EXTENSIONS)
        # the other workers' statistics (``serve --workers N``): None for a lone server
        self.siblings: Callable[[str, str], Awaitable[list[list[dict[str, Any]]]]] | None = None
        # id(config) -> (config, its embedding spec or None)
        self._specs: dict[int, tuple[ModelConfig, EmbeddingSpec | None]] = {}

    # ---- health & metadata ----
    def live(self) -> bool:
        return not self.stopping

    def ready(self) -> bool:
        """Ready once start-up loading is done and until shutdown begins, and, as in Triton
        (``strict_readiness``, the default), only while every model that should serve does:
        a model that failed to load makes the server unready. With strict readiness off,
        the server is ready as long as it answers."""
        if not self.started or self.stopping or self.registry.is_loading():
            return False
        return not (self.strict_readiness and self.registry.unavailable())

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "milliserve", "version": __version__, "extensions": list(self.extensions)}

    def model_ready(self, name: str, version: str = "") -> bool:
        self.registry.get(name, version)  # NotFoundError for unknown names/versions
        return True

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        rt = self.registry.get(name, version)
        return rt.metadata(self.registry.versions(name))

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self.registry.get(name, version).config

    def model_statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        if not name:
            runtimes = self.registry.all_ready()
        elif version:
            runtimes = [self.registry.get(name, version)]
        else:
            self.registry.get(name)  # the not-found / not-ready error, if any
            runtimes = [self.registry.get(name, v) for v in self.registry.versions(name)]
        return [rt.stats.as_dict() for rt in runtimes]

    async def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        """The server's statistics: this process's, summed with its sibling workers'."""
        local = self.model_statistics(name, version)
        if self.siblings is None:
            return local
        return merge_statistics([local, *await self.siblings(name, version)])

    # ---- inference ----
    async def infer(self, request: InferRequest) -> InferResponse:
        servable = self.registry.get(request.model_name, request.model_version)
        return await servable.infer(request)

    def infer_now(self, request: InferRequest) -> InferResponse | None:
        """``infer``'s answer computed in this call, where the servable's road would not wait
        anywhere (its express lane, ``RoadServable.infer_now``); None: await ``infer``."""
        servable = self.registry.get(request.model_name, request.model_version)
        return servable.infer_now(request) if isinstance(servable, RoadServable) else None

    def infer_soon(self, request: InferRequest) -> Soon[InferResponse] | None:
        """For a request that ``infer_now`` left: its answer later in this loop turn, in a
        batch with the turn's other requests to the model (``ModelRuntime.infer_soon``);
        None: await ``infer``."""
        servable = self.registry.get(request.model_name, request.model_version)
        return servable.infer_soon(request) if isinstance(servable, RoadServable) else None

    def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """The responses to one request as the servable produces them (one for a model)."""
        return self.registry.get(request.model_name, request.model_version).stream(request)

    # ---- servables of a kind (generative models: llm.client.EngineClient) ----
    def servable_as(self, kind: Any, name: str, version: str = "", what: str = "") -> Any:
        """The servable ``name`` as a ``kind`` (a runtime-checkable protocol, e.g. the
        front ends' ``EngineClient``); InvalidInputError naming ``what`` it is not, for a
        model of another kind; NotFoundError for an unknown one. The front ends name the
        kind, so that this package knows none of them. (``Any``: mypy takes no protocol
        class for a ``type[K]``; the callers type what they get.)"""
        servable = self.registry.get(name, version)
        if not isinstance(servable, kind):
            raise InvalidInputError(
                f"model {name!r} is not {what or kind.__name__}; call it with /v2/models/{name}/infer"
            )
        return servable

    async def acquire_as(self, kind: Any, name: str, version: str = "", what: str = "") -> Any:
        """``servable_as``, after loading ``name`` if it is a generative model that loads on
        demand (``llm_memory_mib``: repository/on_demand.py)."""
        await self.registry.ensure_loaded(name)
        return self.servable_as(kind, name, version, what)

    def on_demand_models(self) -> dict[str, bool]:
        """Generative models that load on demand, and whether each is loaded (empty unless
        ``llm_memory_mib`` is set)."""
        return self.registry.on_demand_models()

    def ready_as(self, kind: Any) -> list[Any]:
        """The ready servables that are a ``kind`` (``GET /v1/models``: the generative ones)."""
        return [s for s in self.registry.all_ready() if isinstance(s, kind)]

    # ---- embeddings ----
    def _embedding_spec(self, servable: Servable) -> EmbeddingSpec | None:
        config = servable.config
        known = self._specs.get(id(config))
        if known is None or known[0] is not config:
            if len(self._specs) > 256:  # configs of unloaded versions
                self._specs.clear()
            known = self._specs[id(config)] = (config, embedding_spec(config))
        return known[1]

    def embedder(self, name: str, version: str = "") -> Embedder:
        """What embeds texts with the model ``name`` (``/v1/embeddings``); InvalidInputError
        for a model that is not an embedding pipeline, NotFoundError for an unknown one."""
        servable = self.registry.get(name, version)
        spec = self._embedding_spec(servable)
        if spec is None:
            raise InvalidInputError(
                f"model {name!r} is not an embedding model (a pipeline that ends in a pooling step)",
                "model",
            )
        return Embedder(name, version, spec, self.infer)

    def reranker(self, name: str, version: str = "") -> Reranker:
        """What scores documents against a query with the model ``name`` (``/v1/rerank``);
        InvalidInputError for a model that is not a reranking pipeline, NotFoundError for an
        unknown one."""
        servable = self.registry.get(name, version)
        spec = rerank_spec(servable.config)
        if spec is None:
            raise InvalidInputError(
                f"model {name!r} is not a reranker (a pipeline whose tokenizer reads pairs "
                "(tokenizer.pair_input) and that ends in a score step)",
                "model",
            )
        return Reranker(name, version, spec, self.infer)

    def classifier(self, name: str, version: str = "") -> Classifier:
        """What labels texts with the model ``name`` (``/v1/classify``); InvalidInputError
        for a model that is not a classifying pipeline, NotFoundError for an unknown one."""
        servable = self.registry.get(name, version)
        spec = classify_spec(servable.config)
        if spec is None:
            raise InvalidInputError(
                f"model {name!r} is not a classifier (a pipeline with a tokenizer and a rules step "
                "whose labels name the columns of a scores output it declares)",
                "model",
            )
        return Classifier(name, version, spec, self.infer)

    def only_model(self, kind: str) -> str:
        """The name of the one ready reranker (``kind`` "rerank") or classifier ("classify"),
        for a request that names none (TEI serves one model); InvalidInputError when there are
        none or several."""
        spec = rerank_spec if kind == "rerank" else classify_spec
        names = sorted({s.config.name for s in self.registry.all_ready() if spec(s.config) is not None})
        if len(names) != 1:
            what = "reranker" if kind == "rerank" else "classifier"
            served = f"it serves {len(names)}: {names}" if names else f"it serves no {what}"
            raise InvalidInputError(f"'model' is required: name the {what} to use ({served})", "model")
        return names[0]

    def encoder_capabilities(self) -> dict[str, list[str]]:
        """Each ready model ``/v1/embeddings``, ``/v1/rerank`` or ``/v1/classify`` serves, with
        what it serves of ``embed``, ``rerank`` and ``classify`` (``GET /v1/models``, as
        infinity's ``capabilities``)."""
        out: dict[str, list[str]] = {}
        for s in self.registry.all_ready():
            name = s.config.name
            if self._embedding_spec(s) is not None:
                out.setdefault(name, []).append("embed")
            if rerank_spec(s.config) is not None:
                out.setdefault(name, []).append("rerank")
            if classify_spec(s.config) is not None:
                out.setdefault(name, []).append("classify")
        return out

    # ---- repository ----
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every model with its state. It lists the model names, so it answers only where the
        repository API is on or names are exposed (``expose_model_names``); otherwise
        ModelControlDisabledError, as load and unload."""
        if not (self.model_control or self.registry.expose_names):
            raise ModelControlDisabledError(
                "cannot list the repository: the repository API is disabled; start the server with "
                "--model-control-mode explicit (or set MILLISERVE_EXPOSE_MODEL_NAMES=true for a "
                "read-only index)"
            )
        return self.registry.index(ready_only)

    def _check_control(self, action: str) -> None:
        if not self.model_control:
            raise ModelControlDisabledError(
                f"cannot {action}: the repository API is disabled; start the server with "
                "--model-control-mode explicit"
            )

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Load or reload ``name``, with a load request's overrides (``config``, ``file:...``).
        Errors keep their class; their message starts "failed to load", as Triton's."""
        self._check_control(f"load model {name!r}")
        try:
            await self.registry.load(name, parameters or None)
        except MilliserveError as exc:
            if exc.message.startswith("failed to load"):
                raise
            raise type(exc)(f"failed to load {name!r}: {exc.message}") from None

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        params = dict(parameters or {})
        params.pop("unload_dependents", None)  # Triton clients send it; there are no dependents here
        self._check_control(f"unload model {name!r}")
        if params:
            raise RequestError(f"unload model {name!r}: parameters {sorted(params)} are not supported")
        await self.registry.unload(name)
