"""Debian's Chromium, headless, driven by Playwright for Python: what the edge tests and the
edge benchmark load pages in. Nothing downloads a browser (``playwright install`` is never
run); the page may reach only its own origin, every other request is aborted and recorded.

Needs the ``[edge]`` extra (playwright) and the ``chromium`` package.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from milliserve.errors import MissingDependencyError

__all__ = ["CHROMIUM_ARGS", "WEBGPU_ARGS", "chromium", "find_chromium", "offline_page"]

# no sandbox (root in CI containers), no GPU, and no background traffic to Google's hosts
# (with webgpu=True pages still get WebGPU: Chromium's software adapter, SwiftShader, where
# the machine has no GPU)
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--disable-default-apps",
)


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    raise MissingDependencyError("no Chromium on PATH: install Debian's chromium (apt-get install chromium)")


# WebGPU for pages: Linux Chromium keeps it behind this flag
WEBGPU_ARGS = ("--enable-unsafe-webgpu",)


# one Playwright driver per thread, shared by the browsers open at the same time (its sync
# API refuses a second driver while one runs): [driver, browsers using it]
_driver: list[Any] = [None, 0]


@contextmanager
def _playwright() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise MissingDependencyError(
            "the browser tools need playwright: pip install 'milliserve[edge]'"
        ) from None
    if _driver[0] is None:
        _driver[0] = sync_playwright().start()
    _driver[1] += 1
    try:
        yield _driver[0]
    finally:
        _driver[1] -= 1
        if _driver[1] == 0:
            driver, _driver[0] = _driver[0], None
            driver.stop()


@contextmanager
def chromium(webgpu: bool = False) -> Iterator[Any]:
    """A headless Chromium (a Playwright BrowserContext), closed on exit; several may be open
    at once. With ``webgpu`` pages get a WebGPU adapter (without a GPU, Chromium's software
    one, SwiftShader); without it ``navigator.gpu.requestAdapter()`` gives none."""
    executable = find_chromium()
    with tempfile.TemporaryDirectory(prefix="milliserve-chromium-") as profile, _playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=executable,
            headless=True,
            args=[*CHROMIUM_ARGS, *(WEBGPU_ARGS if webgpu else ())],
        )
        try:
            yield context
        finally:
            context.close()


def offline_page(context: Any, origin: str) -> tuple[Any, list[str]]:
    """A new page that may reach ``origin`` only; the list collects the URLs it was refused."""
    refused: list[str] = []
    page = context.new_page()

    def guard(route: Any) -> None:
        url = route.request.url
        if url.startswith(origin + "/") or url == origin:
            route.fallback()
        else:
            refused.append(url)
            route.abort()

    page.route("**/*", guard)
    return page, refused
