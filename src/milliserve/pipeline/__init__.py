"""Pipelines (``platform: ensemble``): models and built-in or custom steps chained by tensor name."""

from milliserve.pipeline.ensemble import PipelineRuntime

__all__ = ["PipelineRuntime"]
