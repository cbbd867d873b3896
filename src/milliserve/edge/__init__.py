"""The browser edge: a static bundle that runs a model in the page with onnxruntime-web and
falls back to the server (``milliserve edge build``), served at ``/edge/<model>/``."""

from milliserve.edge.bundle import EdgeBundle, build_bundle, model_precision

__all__ = ["EdgeBundle", "build_bundle", "model_precision"]
