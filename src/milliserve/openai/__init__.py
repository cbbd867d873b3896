"""OpenAI's wire shapes, transport-free: chat and text completions (``completions``, with
the fields they honour or refuse in ``fields``), the Responses API (``responses``,
``response_events``), embeddings (``embeddings``) and the error body every ``/v1`` route
answers with (``error_body``). The routes that carry them are in ``server/http``; the
request they become, ``GenerationParams``, is the engine's (``llm.generation_params``)."""
