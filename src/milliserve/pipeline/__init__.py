"""Pipelines (``platform: ensemble``): models and built-in or custom steps chained by tensor name."""

from milliserve.pipeline.runtime import PipelineRuntime

__all__ = ["PipelineRuntime"]
