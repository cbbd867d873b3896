"""The browser client's JavaScript, built once with npm and esbuild, then reused.

The sources live in ``edge/web`` (package.json, package-lock.json, build.mjs, src/, static/).
A build copies them to ``$MILLISERVE_CACHE/edge-web-<hash>/``, installs the locked packages
with ``npm ci --ignore-scripts`` (no install script runs: onnxruntime-node's would try to
download) and bundles with esbuild. The output, keyed by a hash of the sources, is reused by
every later ``milliserve edge build``: Node.js is needed once per version of the sources.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from milliserve.config.settings import cache_dir
from milliserve.errors import ConfigError, MissingDependencyError

__all__ = ["WEB_SOURCES", "web_assets"]

WEB_SOURCES = Path(__file__).parent / "web"
_INPUTS = ("package.json", "package-lock.json", "build.mjs", "src", "static")


def _sources_hash() -> str:
    h = hashlib.sha256()
    for name in _INPUTS:
        path = WEB_SOURCES / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(WEB_SOURCES)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900, check=False)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what} took over 15 minutes; is the npm registry reachable?") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise ConfigError(f"{what} failed (exit {done.returncode}):\n{tail}")


def web_assets() -> Path:
    """The folder of built client files (milliserve-edge.js, demo page, ort/*.wasm)."""
    key = _sources_hash()
    root = cache_dir() / f"edge-web-{key}"
    dist = root / "dist"
    if (dist / ".complete").is_file():
        return dist
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise MissingDependencyError(
            "the browser client is built with Node.js (18 or newer) and npm, once per milliserve "
            "version: install them (Debian: apt-get install nodejs npm) and run this again"
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=f".edge-web-{key}-") as tmp:
        work = Path(tmp)
        for name in _INPUTS:
            src = WEB_SOURCES / name
            if src.is_dir():
                shutil.copytree(src, work / name)
            else:
                shutil.copy2(src, work / name)
        _run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], work, "npm ci")
        _run([node, "build.mjs", str(work / "dist")], work, "the esbuild bundle")
        (work / "dist" / ".complete").write_text(key)
        if root.exists():
            shutil.rmtree(root)
        root.mkdir()
        (work / "dist").rename(dist)
    return dist
