"""Each benchmark script owns one section of docs/benchmarks.md and rewrites only it."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = "# Benchmarks\n\nEach section is written by the script it names; rerun the script to refresh it.\n"


def write_section(name: str, body: str, doc: Path = DOC) -> None:
    """Replace (or append) the section ``name`` of ``doc`` with ``body``."""
    text = doc.read_text() if doc.exists() else HEADER
    start, end = f"<!-- section:{name} -->", f"<!-- /section:{name} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        if not text.startswith("# Benchmarks"):
            text = HEADER  # an old single-section file: start over with sections
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
