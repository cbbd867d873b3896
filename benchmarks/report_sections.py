"""Each benchmark script owns one section of docs/benchmarks.md (or of another doc) and
rewrites only it, stamped with the script's name and the hash of what it wrote
(scripts/check_docs.py fails on a section edited by hand), through the results store
(benchmarks/results_store.py: the section's figures as JSON in benchmarks/results/, the doc
rendered from them); and the one way the scripts run a `milliserve bench` level."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
HEADER = "# Benchmarks\n\nEach section is written by the script it names; rerun the script to refresh it.\n"


def commit() -> str:
    """The short hash of the checkout a section was measured at (a section says it)."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False, cwd=DOC.parent
    ).stdout.strip()


def section_digest(body: str) -> str:
    """The hash a section's opening marker carries: of the text between its markers, so
    that scripts/check_docs.py can tell a section edited by hand from one its script wrote."""
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def _script() -> str:
    """The running script, as a path from the repository's root (what a section names)."""
    path = Path(sys.argv[0]).resolve()
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return path.name


def write_section(
    name: str, body: str, doc: Path = DOC, script: str | None = None, results: dict[str, Any] | None = None
) -> None:
    """Replace (or append) the section ``name`` of ``doc`` with ``body``, its opening marker
    naming ``script`` (default: the running script) and the hash of ``body``.

    Where ``doc`` is one of the repository's docs, the section goes through the results store
    (benchmarks/results_store.py): its entry in benchmarks/results/ is written first, with the
    commit, machine, versions and whatever ``results`` holds (``settings``, ``rounds``,
    ``values``, ``summary``, ``headline``, ``peers``, ``sources``), and the doc's section is
    rendered from that entry. A doc elsewhere (a smoke run's ``--out``) gets the section alone."""
    body = body.rstrip()
    script = script or _script()
    doc = doc.resolve()
    if doc.is_relative_to(ROOT) and str(doc.relative_to(ROOT)) in _store().DOCS:
        store = _store()
        entry = store.record(name, body, doc=str(doc.relative_to(ROOT)), script=script, **(results or {}))
        text = doc.read_text() if doc.exists() else HEADER
        doc.write_text(store.place_block(text, entry))
        store.render_readme()
        return
    text = doc.read_text() if doc.exists() else HEADER
    start = f"<!-- section:{name} by {script} sha256:{section_digest(body)} -->"
    end = f"<!-- /section:{name} -->"
    block = f"{start}\n{body}\n{end}"
    pattern = re.compile(re.escape(f"<!-- section:{name}") + r"( [^>]*)? -->.*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


def _store() -> Any:
    """benchmarks/results_store.py (imported late: it imports this module)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    import results_store

    return results_store


def bench_level(
    url: str, model: str, out: Path, *load: str, seconds: float, warmup: float = 1.0
) -> dict[str, Any]:
    """One `milliserve bench` level against ``url`` (host:port or a full URL); ``load`` holds
    the level and data flags (--concurrency/--rate, --data, --shape). Returns its JSON level."""
    target = url if "://" in url else f"http://{url}"
    cmd = [sys.executable, "-m", "milliserve", "bench", target, "-m", model, *load]
    cmd += ["--duration", str(seconds), "--warmup", str(warmup), "--no-calibrate", "--json", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    level: dict[str, Any] = json.loads(out.read_text())["levels"][0]
    return level
