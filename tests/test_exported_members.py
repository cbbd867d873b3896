"""The public API is explicit: what __init__ exports, sorted."""

from __future__ import annotations

import subprocess
import sys

import milliserve


def test_all_is_sorted_and_complete() -> None:
    assert milliserve.__all__ == sorted(milliserve.__all__)
    for name in milliserve.__all__:
        assert hasattr(milliserve, name), name
    public = {n for n in vars(milliserve) if not n.startswith("_")} - {"annotations"}
    modules = {n for n in public if type(getattr(milliserve, n)).__name__ == "module"}
    assert public - modules == set(milliserve.__all__) - {"__version__"}


def test_every_public_name_says_where_it_loads_from() -> None:
    assert set(milliserve._WHERE) == set(milliserve.__all__) - {"__version__"}


def test_importing_the_package_imports_neither_the_server_nor_onnxruntime() -> None:
    # lazy (PEP 562): `import milliserve` is cheap until a name that needs the server is used
    code = (
        "import sys, milliserve\n"
        "heavy = [m for m in ('milliserve.server.assembly', 'onnxruntime', 'numpy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "milliserve.Server\n"
        "assert 'milliserve.server.assembly' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
