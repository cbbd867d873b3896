"""The wire of a generation server as the attacks and the good streaming client speak it:
raw HTTP/1.1 requests (one per connection), a short streamed chat timed to its first
token, and a Prometheus series read back."""

from __future__ import annotations

import re
import socket
import time
import urllib.request

import orjson

from milliserve.drills.target import Target

__all__ = ["GOOD_SOURCE", "chat", "good_stream", "metric", "request"]

# the good client's address: another host, as the server sees it (the attacker is 127.0.0.1)
GOOD_SOURCE = "127.0.0.2"


def request(t: Target, path: str, body: bytes, extra: str = "") -> bytes:
    """A POST of ``body`` as raw bytes. One request per connection: the server closes it
    after the answer (kept alive, an attacker reading to the end waited the keep-alive's
    5 s each time)."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {t.host}\r\nContent-Type: application/json\r\n{extra}"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def chat(t: Target, content: str, **fields: object) -> bytes:
    """A chat completion request for ``t.model`` with one user message."""
    doc = {"model": t.model, "messages": [{"role": "user", "content": content}], **fields}
    return request(t, "/v1/chat/completions", orjson.dumps(doc))


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus series' samples (matching ``labels``) at ``url``."""
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def good_stream(t: Target, source: str = GOOD_SOURCE, timeout: float = 60) -> tuple[str, float]:
    """One short streamed chat from ``source``: its status and time to the first content
    chunk (``inf`` when none came). A refusal's status carries the start of its message
    (``429: model 'smollm2': the first token would come in...``), so that a failed
    assertion says why."""
    t0 = time.perf_counter()
    with socket.create_connection((t.host, t.http_port), timeout=timeout, source_address=(source, 0)) as s:
        s.sendall(chat(t, "Name a colour.", max_tokens=4, temperature=0, stream=True))
        got = b""
        while b"\r\n\r\n" not in got:
            more = s.recv(65536)
            if not more:
                return "closed", float("inf")
            got += more
        status = got.split(b" ", 2)[1].decode()
        if status != "200":
            head, _, body = got.partition(b"\r\n\r\n")
            found = re.search(rb"content-length: *(\d+)", head, re.I)
            while found and len(body) < int(found.group(1)) and (more := s.recv(65536)):
                body += more
            return f"{status}: {body[:200].decode(errors='replace')}", float("inf")
        while b'"content":"' not in got.split(b"\r\n\r\n", 1)[1].replace(b'"content":""', b""):
            more = s.recv(65536)
            if not more:
                return "closed", float("inf")
            got += more
        ttft = time.perf_counter() - t0
        # read it all: to the last event (chunked, so the body ends after it; waiting for the
        # connection's end instead took the server's keep-alive, 5 s, for each request)
        while b"data: [DONE]" not in got and (more := s.recv(65536)):
            got += more
    return status, ttft
