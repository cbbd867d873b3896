"""Generative models: the continuous-batching engine, its servable, and the OpenAI and
Triton generate protocols (transport-free)."""
