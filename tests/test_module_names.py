"""No two modules of one name in different packages (STYLE.md: "no repeated module names in
different folders"): a name says what a module is, so ``runtime/execute.py`` beside
``runtime/executor.py``, or three ``report.py``, sent a reader to the wrong file."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "milliserve"

# names still shared, each a debt its owner is renaming: none now, keep it so
KNOWN: dict[str, set[str]] = {}


def test_no_two_modules_share_a_name() -> None:
    where: dict[str, set[str]] = defaultdict(set)
    for path in SRC.rglob("*.py"):
        if path.name != "__init__.py" and not path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            where[path.name].add(str(path.relative_to(SRC)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    new = {name: sorted(paths) for name, paths in shared.items() if paths != KNOWN.get(name)}
    assert not new, f"modules sharing a name (rename one, or name the debt in KNOWN): {new}"
    gone = sorted(set(KNOWN) - set(shared))
    assert not gone, f"no longer shared: remove {gone} from KNOWN"
