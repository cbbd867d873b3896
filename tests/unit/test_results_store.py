"""The results store (benchmarks/results_store.py), on a git repository of its own: an entry
written and read back, the doc sections and the README table rendered from it, and the
check's two ways to fail: a doc that differs from the store (always), and a figure whose
code changed after it was measured (a warning, a failure with --strict)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import results_store  # noqa: E402

store: ModuleType = results_store
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(["git", *args], cwd=root, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _commit(root: Path, message: str) -> str:
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", message)
    return _git(root, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "benchmarks").mkdir()
    (root / "docs").mkdir()
    (root / "src" / "pkg" / "fast.py").write_text("x = 1\n")
    (root / "src" / "pkg" / "other.py").write_text("y = 1\n")
    (root / "benchmarks" / "speed.py").write_text("print('measures pkg.fast')\n")
    (root / "docs" / "benchmarks.md").write_text("# Benchmarks\n\nProse by hand, kept.\n")
    (root / "README.md").write_text(
        f"# pkg\n\n- a feature\n\n{store.BEGIN}\n{store.END}\n\n## Usage\n\nby hand\n"
    )
    _git(root, "init", "-q")
    _commit(root, "start")
    return root


SOURCES = ["benchmarks/speed.py", "src/pkg/fast.py"]


def _measure(root: Path, p50: float = 120.0) -> dict[str, Any]:
    entry: dict[str, Any] = store.record(
        "speed",
        f"## Speed\n\np50 {p50} µs against 240 µs\n",
        doc="docs/benchmarks.md",
        script="benchmarks/speed.py",
        root=root,
        settings={"milliserve": {"threads": 1}, "peer": {"workers": 2}},
        rounds=3,
        values={"milliserve_p50_us": [118.0, p50, 125.0], "peer_p50_us": [230.0, 240.0, 260.0]},
        summary={"milliserve_p50_us": p50, "peer_p50_us": 240.0},
        headline=[
            {
                "measure": "p50 (lower is better)",
                "milliserve": f"{p50} µs",
                "against": "peer, 240 µs",
                "ratio": f"{p50 / 240:.2f}×",
            }
        ],
        peers={"peer": "1.0"},
        sources=SOURCES,
    )
    return entry


def test_an_entry_is_written_and_read_back(repo: Path) -> None:
    entry = _measure(repo)
    path = repo / "benchmarks" / "results" / "speed.json"
    assert json.loads(path.read_text()) == entry
    assert store.load(repo) == {"speed": entry}
    assert entry["status"] == "measured" and entry["commit"] == _git(repo, "rev-parse", "HEAD")
    assert entry["dirty"] is False and entry["date"].endswith("Z")
    assert entry["rounds"] == 3 and entry["values"]["peer_p50_us"] == [230.0, 240.0, 260.0]
    assert entry["settings"]["peer"] == {"workers": 2} and entry["sources"] == SOURCES
    machine = entry["machine"]
    assert machine["logical_cores"] >= 1 and machine["python"] and isinstance(machine["cpu_flags"], list)
    assert set(machine["cpu_flags"]) <= set(store.CPU_FLAGS)
    assert entry["versions"]["peers"]["peer"] == "1.0" and "onnxruntime" in entry["versions"]["milliserve"]


def test_the_docs_and_the_readme_are_rendered_from_the_store(repo: Path) -> None:
    _measure(repo)
    assert store.render(repo) == ["docs/benchmarks.md", "README.md"]
    doc = (repo / "docs" / "benchmarks.md").read_text()
    assert doc.startswith("# Benchmarks\n\nProse by hand, kept.\n")
    assert "<!-- section:speed by benchmarks/speed.py sha256:" in doc and "p50 120.0 µs" in doc
    readme = (repo / "README.md").read_text()
    table = readme[readme.index(store.BEGIN) : readme.index(store.END)]
    assert "| p50 (lower is better) | 120.0 µs | peer, 240 µs | 0.50× | `speed` (" in table
    assert readme.endswith("## Usage\n\nby hand\n")  # only what lies between the markers moves
    assert store.render(repo) == []  # a second render changes nothing

    # a new measurement replaces the section in place, the prose around it kept
    _measure(repo, p50=100.0)
    store.render(repo)
    doc = (repo / "docs" / "benchmarks.md").read_text()
    assert doc.count("<!-- section:speed ") == 1 and "p50 100.0 µs" in doc and "Prose by hand" in doc
    assert "100.0 µs | peer, 240 µs | 0.42×" in (repo / "README.md").read_text()


def test_an_imported_section_keeps_its_text_and_names_its_commit(repo: Path) -> None:
    first = _git(repo, "rev-parse", "HEAD")
    doc = repo / "docs" / "benchmarks.md"
    doc.write_text(
        doc.read_text()
        + "\n<!-- section:old by benchmarks/speed.py sha256:0000000000000000 -->\n"
        + f"## Old\n\nat commit {first[:7]}\n\n"
        + "<!-- /section:old -->\n"
        + "\n<!-- section:older by benchmarks/speed.py sha256:0000000000000000 -->\n## Older\n\nno commit\n"
        + "<!-- /section:older -->\n"
    )
    assert store.import_docs(repo, ("docs/benchmarks.md",)) == ["old", "older"]
    entries = store.load(repo)
    assert entries["old"]["status"] == "imported" and entries["old"]["commit"] == first
    assert entries["old"]["body"] == f"## Old\n\nat commit {first[:7]}\n"  # its trailing blank line kept
    assert entries["older"]["commit"] is None
    store.render(repo)
    assert "sha256:0000000000000000" not in doc.read_text()  # stamped with the hash of what it holds
    assert "no commit (unreproducible until re-run): older." in (repo / "README.md").read_text()
    stale = store.check(repo).stale
    assert any(s.startswith("older: names no commit") for s in stale)


def test_the_check_fails_where_a_doc_differs_from_the_store(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _measure(repo)
    store.render(repo)
    assert store.main(["check"], root=repo) == 0

    doc = repo / "docs" / "benchmarks.md"
    doc.write_text(doc.read_text().replace("p50 120.0 µs", "p50 90.0 µs"))  # a figure edited by hand
    assert store.main(["check"], root=repo) == 1
    assert "docs/benchmarks.md: section 'speed' differs from the store" in capsys.readouterr().err

    store.render(repo)
    readme = repo / "README.md"
    readme.write_text(readme.read_text().replace("0.50×", "0.40×"))
    assert store.main(["check"], root=repo) == 1
    assert "README.md: the results table differs from the store" in capsys.readouterr().err

    store.render(repo)
    doc.write_text(
        doc.read_text() + "\n<!-- section:loose by x.py sha256:0 -->\nx\n<!-- /section:loose -->\n"
    )
    assert store.main(["check"], root=repo) == 1
    assert "section 'loose' has no entry in benchmarks/results/" in capsys.readouterr().err

    readme.write_text("# pkg\n")
    assert store.main(["check"], root=repo) == 1
    assert "no <!-- results:begin --> ... <!-- results:end --> markers" in capsys.readouterr().err


def test_a_figure_measured_before_its_code_changed_is_stale(
    repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(store.STRICT_ENV, raising=False)
    _measure(repo)
    store.render(repo)
    _commit(repo, "the results")
    (repo / "src" / "pkg" / "other.py").write_text("y = 2\n")  # not among its sources
    _commit(repo, "other code")
    assert store.check(repo).stale == []

    (repo / "src" / "pkg" / "fast.py").write_text("x = 2\n")
    _commit(repo, "the measured code")
    found = store.check(repo)
    assert found.mismatches == [] and len(found.stale) == 1
    assert found.stale[0].startswith("speed: measured at ") and "src/pkg/fast.py" in found.stale[0]
    assert "re-run benchmarks/speed.py" in found.stale[0]

    assert store.main(["check"], root=repo) == 0  # by default a warning
    assert "WARNING: stale figures (1" in capsys.readouterr().err
    assert store.main(["check", "--strict"], root=repo) == 1
    assert "STALE figures (1" in capsys.readouterr().err
    monkeypatch.setenv(store.STRICT_ENV, "1")
    assert store.main(["check"], root=repo) == 1

    # measured again at HEAD: fresh
    monkeypatch.delenv(store.STRICT_ENV)
    _measure(repo)
    store.render(repo)
    assert store.check(repo).stale == [] and store.main(["check", "--strict"], root=repo) == 0

    # measured with the code it measures changed but not committed: which code, nobody can say
    (repo / "src" / "pkg" / "fast.py").write_text("x = 3\n")
    _measure(repo)
    store.render(repo)
    [why] = store.check(repo).stale
    assert "with uncommitted changes to what it measures" in why


def test_a_commit_the_history_lacks_or_no_git_at_all_is_said_not_a_crash(repo: Path, tmp_path: Path) -> None:
    entry = _measure(repo)
    entry["commit"] = "f" * 40  # e.g. a shallow clone that does not reach it
    store.save(entry, repo)
    [why] = store.check(repo).stale
    assert "which this history does not hold" in why

    bare = tmp_path / "not-a-repo"
    bare.mkdir()
    (bare / "docs").mkdir()
    (bare / "docs" / "benchmarks.md").write_text("# Benchmarks\n")
    store.save(entry, bare)
    store.render(bare)
    found = store.check(bare)
    assert found.mismatches == [] and "which this history does not hold" in found.stale[0]


def test_what_a_script_measured_is_stored_as_json() -> None:
    from argparse import Namespace
    from dataclasses import dataclass, field

    @dataclass
    class Level:
        ttft: list[float] = field(default_factory=list)
        tokens: int = 0
        latency_us: dict[str, float] = field(default_factory=dict)
        nested: list[dict[str, int]] = field(default_factory=list)

    results = {("fraud_mlp", "HTTP", 1): [(2900.0, 0.33, 0.6)], ("fraud_mlp", "HTTP", 8): []}
    assert store.jsonable(results) == [
        {"key": ["fraud_mlp", "HTTP", 1], "value": [[2900.0, 0.33, 0.6]]},
        {"key": ["fraud_mlp", "HTTP", 8], "value": []},
    ]
    assert store.jsonable({1: Path("a/b"), 8: Namespace(rounds=3)}) == {"1": "a/b", "8": {"rounds": 3}}
    level = Level(
        ttft=[float(x) for x in range(1, 101)], tokens=7, latency_us={"p50": 1.0}, nested=[{"a": 1}]
    )
    assert store.jsonable(level)["ttft"][-1] == 100.0  # whole, where a script asks for it
    # briefly: the samples as their count and nearest-rank percentiles
    assert store.brief(level) == {
        "ttft": {"n": 100, "p50": 50.0, "p99": 99.0, "max": 100.0},
        "tokens": 7,
        "latency_us": {"p50": 1.0},
    }
    assert store.brief(Level())["ttft"] == {"n": 0}


def test_a_benchmark_s_write_section_goes_through_the_store(repo: Path) -> None:
    """report_sections.write_section, as every benchmark calls it, run from a copy of the
    benchmark modules in the temporary repository (their ROOT is where they lie)."""
    import shutil

    for name in ("report_sections.py", "results_store.py"):
        shutil.copy(ROOT / "benchmarks" / name, repo / "benchmarks" / name)
    (repo / "benchmarks" / "peers").mkdir()
    shutil.copy(ROOT / "benchmarks" / "peers" / "peer_settings.py", repo / "benchmarks" / "peers")
    _commit(repo, "the benchmark modules")
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(repo / 'benchmarks')!r})\n"
        "from report_sections import write_section\n"
        "results = {('fraud_mlp', 1): [(2900.0, 0.33)]}\n"
        "write_section('speed', '## Speed\\n\\np50 0.33 ms\\n', results={'rounds': 1, 'values': results})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = [sys.executable, "-c", script, "--rounds", "1"]
    subprocess.run(run, cwd=repo, env=env, check=True, capture_output=True, text=True)
    entry = store.load(repo)["speed"]
    assert entry["script"] == "-c"  # python -c: no script file
    assert entry["values"] == [{"key": ["fraud_mlp", 1], "value": [[2900.0, 0.33]]}] and entry["rounds"] == 1
    assert entry["commit"] == _git(repo, "rev-parse", "HEAD") and entry["command"].endswith("--rounds 1")
    assert entry["versions"]["peers"]["fastembed"]  # the peers' pins, from peer_settings.py
    doc = (repo / "docs" / "benchmarks.md").read_text()
    assert store.render_block(entry) in doc and doc.startswith("# Benchmarks\n\nProse by hand, kept.\n")
    assert store.mismatches(repo) == []


def test_figures_no_section_holds_are_stored_and_checked_for_staleness_only(repo: Path) -> None:
    entry = store.record(
        "printed",
        "| type | recall |\n|---|---|\n| int8 | 0.99 |",
        doc=None,
        script="benchmarks/speed.py",
        root=repo,
    )
    assert entry["doc"] is None and store.load(repo)["printed"]["body"].endswith("| int8 | 0.99 |")
    assert store.render(repo) == ["README.md"] and store.mismatches(repo) == []  # the table only
    (repo / "benchmarks" / "speed.py").write_text("print('changed')\n")
    _commit(repo, "the script changed")
    assert [s.split(":")[0] for s in store.check(repo).stale] == ["printed"]
