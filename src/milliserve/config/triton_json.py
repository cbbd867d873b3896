"""A model's config as Triton writes it: the JSON of ``GET /v2/models/{m}/config`` and the
protobuf message of gRPC ``ModelConfig`` (``config/model_config.py`` reads it)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from milliserve.config.model_config import InstanceGroup, ModelConfig, TensorConfig
from milliserve.protocol.datatypes import oip_to_config_type
from milliserve.protocol.proto import oip_pb2

__all__ = ["config_to_dict", "config_to_proto"]


def config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The config as Triton's JSON (``GET /v2/models/{m}/config``): integers stay integers,
    data types are spelled ``TYPE_*``."""

    def tensor(t: TensorConfig) -> dict[str, Any]:
        out = {"name": t.name, "data_type": oip_to_config_type(t.data_type), "dims": list(t.dims)}
        return {**out, "optional": True} if t.optional else out

    out: dict[str, Any] = {
        "name": cfg.name,
        "platform": cfg.platform or "onnxruntime_onnx",
        "backend": cfg.backend or "onnxruntime",
        "version_policy": cfg.version_policy.model_dump(exclude_none=True) or {"latest": {"num_versions": 1}},
        "max_batch_size": cfg.max_batch_size,
        "input": [tensor(t) for t in cfg.input],
        "output": [tensor(t) for t in cfg.output],
        "instance_group": [
            g.model_dump()
            for g in (cfg.instance_group or (() if cfg.ensemble_scheduling else (InstanceGroup(),)))
        ],
        "parameters": {k: {"string_value": v} for k, v in cfg.parameters.items()},
    }
    if cfg.dynamic_batching is not None:
        out["dynamic_batching"] = cfg.dynamic_batching.model_dump()
    if cfg.sequence_batching is not None:
        out["sequence_batching"] = cfg.sequence_batching.to_dict()
    if cfg.response_cache is not None:
        out["response_cache"] = cfg.response_cache.model_dump()
    if cfg.budget is not None:
        out["budget"] = cfg.budget.model_dump()
    for key in ("features", "tokenizer", "ensemble_scheduling"):
        value = getattr(cfg, key)
        if value is not None:
            out[key] = value.model_dump(exclude_none=True)
    if cfg.ensemble_scheduling is not None:
        out["platform"], out["backend"] = "ensemble", ""
    if cfg.model_warmup:
        out["model_warmup"] = [w.model_dump() for w in cfg.model_warmup]
        for w in out["model_warmup"]:
            for inp in w["inputs"].values():
                inp["data_type"] = oip_to_config_type(inp["data_type"])
                # a oneof on the wire: only the chosen source is written
                for key in ("zero_data", "random_data"):
                    if not inp[key]:
                        del inp[key]
    return out


def config_to_proto(cfg: ModelConfig) -> oip_pb2.ModelConfig:
    """The config as the protobuf message returned by gRPC ``ModelConfig``."""
    msg = oip_pb2.ModelConfig()
    json_format.ParseDict(config_to_dict(cfg), msg)
    return msg
