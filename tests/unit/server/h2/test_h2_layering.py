"""The HTTP/2 transport is a package of its own under the gRPC layer: it imports nothing of
gRPC, models or the runtime, and nothing from another package's private modules (the HPACK
tables are its own)."""

from __future__ import annotations

import ast
from pathlib import Path

import milliserve.server.h2 as h2

H2 = Path(h2.__file__).parent


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def test_the_transport_imports_only_itself_and_the_standard_library() -> None:
    for path in sorted(H2.glob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            if top == "milliserve":
                assert name.startswith("milliserve.server.h2."), f"{path.name} imports {name}"
            else:
                assert top in {
                    "__future__",
                    "asyncio",
                    "collections",
                    "dataclasses",
                    "logging",
                    "struct",
                    "typing",
                }, f"{path.name} imports {name}"
