"""Answers streamed as Server-Sent Events, with the client watched: a client that
disconnects cancels its sequence at once (the engine frees it within one decoding step),
not when the next token fails to send. A client that stays connected and stops reading
holds little: a stream's socket buffer is small (``stream_buffer_bytes``), and a chunk
that cannot be written within ``stream_write_timeout_s`` cancels the sequence and closes
the connection. A whole (not streamed) answer is watched the same way while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable
from typing import Any

from milliserve.errors import MilliserveError
from milliserve.llm.client import EngineClient, GenerationEvents
from milliserve.openai.error_body import openai_error
from milliserve.protocol.json_codec import encode_json
from milliserve.server.http.asgi import Receive, Send
from milliserve.status import status_of

__all__ = ["DONE", "SSE_HEADERS", "ClientGone", "EventStreams", "sse", "typed_event"]

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
DONE = b"data: [DONE]\n\n"


def sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + encode_json(doc) + b"\n\n"


def typed_event(event: dict[str, Any]) -> bytes:
    """A Responses API event: SSE with its type as the event name."""
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + encode_json(event) + b"\n\n"


class ClientGone(Exception):
    """The client disconnected."""


async def disconnected(receive: Receive) -> None:
    """Return when the client has disconnected (the body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def transport_of(send: Send) -> Any:
    """The connection's transport behind our HTTP server's ``send`` (None on another ASGI server)."""
    return getattr(getattr(send, "__self__", None), "transport", None)


class EventStreams:
    """The streams of one set of routes, and what a client that does not read may hold."""

    def __init__(self, write_timeout_s: float = 15.0, buffer_bytes: int = 64 << 10) -> None:
        self.stalled = 0  # streams cancelled because their client stopped reading
        self.configure(write_timeout_s, buffer_bytes)

    def configure(self, write_timeout_s: float, buffer_bytes: int) -> None:
        """What a stream whose client does not read may hold (``HttpSettings``)."""
        self.write_timeout_s = write_timeout_s
        self.buffer_bytes = buffer_bytes

    async def complete(self, work: Awaitable[Any], receive: Receive) -> Any:
        """The whole answer (``work``'s result), cancelled at once if the client disconnects
        while it waits."""
        task = asyncio.ensure_future(work)
        watcher = asyncio.create_task(disconnected(receive))
        try:
            await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not task.done():
            task.cancel()  # leaves the event iterator: the engine frees the sequence
            with contextlib.suppress(BaseException):
                await task
            raise ClientGone
        return task.result()

    def _bound(self, send: Send) -> Any:
        """Make the stream's buffers small (a client that stops reading then blocks the
        next write instead of soaking up megabytes of text in socket buffers)."""
        transport = transport_of(send)
        if transport is None:
            return None
        with contextlib.suppress(AttributeError, OSError, ValueError):
            transport.set_write_buffer_limits(high=self.buffer_bytes)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.buffer_bytes)
        return transport

    async def stream(
        self,
        servable: EngineClient,
        stream: GenerationEvents,
        receive: Receive,
        send: Send,
        chunks: Any,
        t0: int,
    ) -> None:
        """Write ``chunks`` (SSE bytes) as a 200 answer until they end; a client gone or
        stalled cancels ``stream``, and an error after the status line goes in the stream,
        as OpenAI sends it. The outcome is recorded on ``servable``."""
        gone = asyncio.Event()

        async def watch() -> None:
            await disconnected(receive)
            gone.set()
            stream.cancel()  # free the sequence now, not at the next token

        watcher = asyncio.create_task(watch())
        error: BaseException | None = None
        transport = self._bound(send)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": list(SSE_HEADERS)})
            async for chunk in chunks:
                if gone.is_set():
                    raise ClientGone
                body = {"type": "http.response.body", "body": chunk, "more_body": True}
                if transport is not None and not transport.get_write_buffer_size():
                    # nothing is queued, so the write cannot wait for the client: no timer (a
                    # timer a token was a tenth of the loop's work for a stream)
                    await send(body)
                    continue
                try:
                    async with asyncio.timeout(self.write_timeout_s):
                        await send(body)
                except TimeoutError:  # the client stopped reading: free its slot, drop it
                    self.stalled += 1
                    gone.set()
                    stream.cancel()
                    if transport is not None:
                        transport.abort()
                    raise ClientGone from None
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except ClientGone as exc:
            error = asyncio.CancelledError()
            raise exc from None
        except MilliserveError as exc:
            # the status line is out: the error goes in the stream, as OpenAI does
            error = exc
            doc = openai_error(status_of(exc).http, exc.message)
            if not gone.is_set():
                await send({"type": "http.response.body", "body": sse(doc), "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except BaseException as exc:
            error = exc
            raise
        finally:
            watcher.cancel()
            stream.cancel()
            await chunks.aclose()
            servable.record(t0, error)
