"""The one results store: every benchmark's figures as JSON, one file per section under
``benchmarks/results/<section>.json`` (committed: these are the measured figures), and
everything a doc quotes rendered from it.

A benchmark script calls ``report_sections.write_section(name, body, results={...})`` as
before; for a section of one of the repository's docs that records an entry here first
(:func:`record`) and then renders the doc's section from the entry. An entry holds:

- ``section``, ``doc`` (the page, from the repository root; null for a script that only
  prints its table, whose figures are stored all the same), ``script`` (what writes it),
  ``command`` (how it ran);
- ``status``: ``measured`` (written by its script) or ``imported`` (taken from the docs as
  they were before this store, with the commit the section named, or none);
- ``commit`` (full hash of HEAD when measured), ``dirty`` (its sources had uncommitted
  changes then), ``date`` (UTC, ISO 8601);
- ``machine``: CPU model, logical and usable cores, the CPU flags that matter here (avx2,
  avx512f, avx512_vnni, avx_vnni, avx512_bf16, amx), Python, kernel;
- ``versions``: milliserve's key packages as installed, and the peers (the pins of
  benchmarks/peers/peer_settings.py plus what the script names, e.g. perf_analyzer);
- ``settings`` of every side, ``rounds``, ``values`` (per-round values), ``summary`` (the
  figures the section quotes), ``headline`` (rows for the README's results table);
- ``sources``: the paths whose code the figures describe (the script, its helpers and the
  src packages it exercises): when one of them changes after ``commit``, the section is stale;
- ``body``: the section's Markdown, as its script wrote it.

Commands (``scripts/gen_results.py`` runs this module)::

    python scripts/gen_results.py render          # docs' sections and README table from the store
    python scripts/gen_results.py check           # fails if a doc differs from the store; warns on stale
    python scripts/gen_results.py check --strict  # stale figures fail too (or MILLISERVE_RESULTS_STRICT=1)
    python scripts/gen_results.py stale           # list stale sections only
    python scripts/gen_results.py import          # seed entries for doc sections the store lacks

Staleness is a warning by default because a full re-run of every benchmark happens at once,
on one quiet machine, and until then the docs keep quoting the last figures with their
commit; ``--strict`` is for that re-run's end, when nothing may be stale.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from report_sections import section_digest

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = 1
RESULTS_DIR = Path("benchmarks") / "results"
DOCS = ("docs/benchmarks.md", "docs/bench.md", "docs/optimize.md")
README = "README.md"
BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
STRICT_ENV = "MILLISERVE_RESULTS_STRICT"
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
# milliserve's own packages whose versions move its figures
KEY_PACKAGES = (
    "milliserve",
    "onnxruntime",
    "numpy",
    "uvloop",
    "httptools",
    "tokenizers",
    "protobuf",
    "pydantic",
    "llama_cpp_python",
    "redis",
)
SECTION = re.compile(
    r"<!-- section:(?P<name>[\w.-]+)(?P<attrs>[^>]*?) -->\n(?P<body>.*?)\n<!-- /section:(?P=name) -->", re.S
)
COMMIT_IN_BODY = re.compile(r"(?:[Cc]ommit|\bat) `?([0-9a-f]{7,40})`?\b")

_SERVER = [
    "src/milliserve/server",
    "src/milliserve/runtime",
    "src/milliserve/protocol",
    "src/milliserve/config",
]
_ORT = ["src/milliserve/backends/onnxruntime.py", "src/milliserve/backends/base.py"]
_LLM = [
    "src/milliserve/llm",
    "src/milliserve/backends/llama_cpp.py",
    "src/milliserve/backends/llama_options.py",
]
# what each script's figures describe, beside the script itself (paths from the root; a
# folder stands for everything under it)
SOURCES: dict[str, list[str]] = {
    "benchmarks/server_overhead.py": ["benchmarks/apps", "src/milliserve/observability", *_SERVER, *_ORT],
    "benchmarks/bench_vs_perf_analyzer.py": ["src/milliserve/bench", *_SERVER, *_ORT],
    "benchmarks/peers/run_peers.py": ["benchmarks/peers", *_SERVER, *_ORT],
    "benchmarks/adaptive_batching.py": [
        "src/milliserve/runtime/batcher.py",
        "src/milliserve/runtime/adaptive.py",
    ],
    "benchmarks/overload.py": [*_SERVER, *_ORT],
    "benchmarks/pipelines.py": ["src/milliserve/pipeline", "src/milliserve/features", *_SERVER, *_ORT],
    "benchmarks/attack_suite.py": [
        "src/milliserve/drills",
        *_SERVER,
        *_ORT,
        *_LLM,
    ],
    "benchmarks/llm.py": [
        "src/milliserve/bench/llm_client.py",
        "src/milliserve/bench/llm_workload.py",
        "src/milliserve/bench/llm_stream.py",
        "src/milliserve/server/http",
        *_LLM,
    ],
    "benchmarks/llm_features.py": ["src/milliserve/server/http", *_LLM],
    "benchmarks/ann_choice.py": ["src/milliserve/pipeline/ann.py", "src/milliserve/pipeline/ann_index.py"],
    "benchmarks/ann_search.py": [
        "src/milliserve/pipeline/ann.py",
        "src/milliserve/pipeline/ann_index.py",
        "src/milliserve/pipeline/text_index.py",
        *_SERVER,
        *_ORT,
    ],
    "benchmarks/mini_project.py": [
        "benchmarks/mini_project_parts.py",
        "src/milliserve/examples",
        "src/milliserve/pipeline",
        "src/milliserve/cache",
        "src/milliserve/redis_client.py",
        "src/milliserve/optimize",
        *_SERVER,
        *_ORT,
    ],
    "benchmarks/hedging.py": ["src/milliserve/pipeline/hedge.py", *_SERVER, *_ORT],
    "benchmarks/cascade.py": ["src/milliserve/pipeline/cascade.py", *_SERVER, *_ORT],
    "benchmarks/edge.py": ["src/milliserve/edge", "src/milliserve/cli/edge_cmd.py", *_SERVER, *_ORT],
    "benchmarks/workers.py": [
        "src/milliserve/server/workers.py",
        "src/milliserve/server/worker_process.py",
        *_SERVER,
        *_ORT,
    ],
    "benchmarks/ray_overhead.py": ["src/milliserve/integrations", *_SERVER, *_ORT],
    "benchmarks/grpc_road.py": [*_SERVER, *_ORT],
    "benchmarks/embeddings.py": [
        "src/milliserve/runtime/embedding.py",
        "src/milliserve/runtime/embedding_types.py",
        "src/milliserve/server/http",
        "src/milliserve/examples/minilm_embed.py",
        "src/milliserve/pipeline",
        *_ORT,
    ],
    "benchmarks/shm_road.py": [
        "src/milliserve/server/shm",
        "src/milliserve/server/grpc",
        "src/milliserve/server/http",
        "src/milliserve/protocol",
        *_ORT,
    ],
    "benchmarks/fixed_rate_clock.py": ["src/milliserve/bench", *_SERVER, *_ORT],
    "benchmarks/embedding_types.py": [
        "src/milliserve/runtime/embedding_types.py",
        "src/milliserve/examples/minilm.py",
    ],
    "benchmarks/optimize_examples.py": ["src/milliserve/optimize", "src/milliserve/examples", *_ORT],
}


# ---- the machine, the versions, git ----
def machine() -> dict[str, Any]:
    """What the figures were measured on (a results file says which VM it came from)."""
    model, flags = "", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    model = model or platform.processor()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 0
    return {
        "cpu_model": model,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "cpu_flags": [f for f in CPU_FLAGS if f in flags],
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def package_versions(names: tuple[str, ...] | list[str] = KEY_PACKAGES) -> dict[str, str | None]:
    """Installed versions (None where a package is absent)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def peer_pins() -> dict[str, str]:
    """The peers' pinned versions (benchmarks/peers/peer_settings.py), {} where unreadable."""
    folder = str(ROOT / "benchmarks" / "peers")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        from peer_settings import VERSIONS  # type: ignore[import-not-found]

        return dict(VERSIONS)
    except Exception:
        return {}


def _peer_versions(peers: dict[str, Any]) -> dict[str, Any]:
    """What a script names of its peers; a name given None is looked up as installed."""
    return {k: (package_versions([k])[k] if v is None else jsonable(v)) for k, v in peers.items()}


def _git(root: Path, *args: str) -> str | None:
    """A git command's stdout, or None where git, the repository or the object is missing."""
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def head(root: Path = ROOT) -> str | None:
    return _git(root, "rev-parse", "HEAD")


def resolve(commit: str, root: Path = ROOT) -> str | None:
    """A short hash as the full one, None where this history does not hold it."""
    return _git(root, "rev-parse", "--verify", "-q", f"{commit}^{{commit}}")


# ---- entries ----
def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: a dict with tuple keys (a script's ``results[(target,
    concurrency)]``) as a list of ``{"key": [...], "value": ...}``, tuples and sets as lists,
    numpy numbers as Python's, dataclasses as dicts, paths and other objects as strings."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: jsonable(v) for k, v in value.items()}
        if all(isinstance(k, int | float | bool) or k is None for k in value):
            return {str(k): jsonable(v) for k, v in value.items()}
        return [{"key": jsonable(k), "value": jsonable(v)} for k, v in value.items()]
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(_fields(value))
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return jsonable(value.tolist())
    if isinstance(value, argparse.Namespace):
        return jsonable(vars(value))
    return str(value)


def _fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields (or an object's attributes), not copied: a field may hold what
    cannot be copied (an index, a session)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in fields(obj)}
    return dict(vars(obj))


def brief(obj: Any) -> dict[str, Any]:
    """A level's figures without its raw samples: its numbers, strings and dicts of numbers as
    they are, and each list of numbers (per-request latencies) as its count, p50, p99 and
    maximum (nearest rank, ``milliserve.percentiles``), so that a round stays a few lines."""
    from milliserve.percentiles import percentile

    out: dict[str, Any] = {}
    for key, value in _fields(obj).items():
        if value is None or isinstance(value, bool | int | float | str):
            out[key] = value
        elif isinstance(value, dict) and all(isinstance(v, int | float) for v in value.values()):
            out[key] = jsonable(value)
        elif isinstance(value, list) and all(isinstance(v, int | float) for v in value):
            n = len(value)
            out[key] = {
                "n": n,
                **(
                    {"p50": percentile(value, 50), "p99": percentile(value, 99), "max": max(value)}
                    if n
                    else {}
                ),
            }
    return out


def sources_for(script: str) -> list[str]:
    return [script, *SOURCES.get(script, [])]


def entry_path(section: str, root: Path = ROOT) -> Path:
    return root / RESULTS_DIR / f"{section}.json"


def load(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """Every entry, by section name."""
    folder = root / RESULTS_DIR
    out = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        entry = json.loads(path.read_text())
        out[entry["section"]] = entry
    return out


def save(entry: dict[str, Any], root: Path = ROOT) -> Path:
    path = entry_path(entry["section"], root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry, indent=1, ensure_ascii=False) + "\n")
    return path


def record(
    section: str,
    body: str,
    *,
    doc: str | None,
    script: str,
    root: Path = ROOT,
    settings: dict[str, Any] | None = None,
    rounds: int | None = None,
    values: Any = None,
    summary: dict[str, Any] | None = None,
    headline: list[dict[str, str]] | None = None,
    peers: dict[str, Any] | None = None,
    sources: list[str] | None = None,
    commit: str | None = None,
) -> dict[str, Any]:
    """Write the store's entry for ``section``, measured now at HEAD (or at ``commit``, for
    figures measured earlier and published now), and return it."""
    srcs = sources if sources is not None else sources_for(script)
    dirty = _git(root, "status", "--porcelain", "--", *srcs)
    entry: dict[str, Any] = {
        "schema": SCHEMA,
        "section": section,
        "doc": doc,
        "script": script,
        "command": " ".join(["python", script, *sys.argv[1:]]),
        "status": "measured",
        "commit": (resolve(commit, root) or commit) if commit else head(root),
        "dirty": bool(dirty),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "versions": {
            "milliserve": package_versions(),
            "peers": {**peer_pins(), **_peer_versions(peers or {})},
        },
        "settings": jsonable(settings or {}),
        "rounds": rounds,
        "values": jsonable(values),
        "summary": jsonable(summary or {}),
        "headline": headline or [],
        "sources": srcs,
        "body": body.rstrip(),
    }
    save(entry, root)
    return entry


# ---- rendering ----
def render_block(entry: dict[str, Any]) -> str:
    """A doc's section, markers included, exactly as the store holds it."""
    body = entry["body"]
    start = f"<!-- section:{entry['section']} by {entry['script']} sha256:{section_digest(body)} -->"
    return f"{start}\n{body}\n<!-- /section:{entry['section']} -->"


def place_block(text: str, entry: dict[str, Any]) -> str:
    """``text`` with the entry's section replaced, or appended where it has none."""
    name = entry["section"]
    block = render_block(entry)
    pattern = re.compile(
        re.escape(f"<!-- section:{name}") + r"( [^>]*)? -->.*?" + re.escape(f"<!-- /section:{name} -->"), re.S
    )
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    return text.rstrip() + "\n\n" + block + "\n"


# the README table's order of sections (others follow, by name)
TABLE_ORDER = (
    "server-overhead",
    "peers",
    "embeddings",
    "llm-peers",
    "llm-open-loop",
    "llm-speculation-fresh",
    "mini-project",
    "reliability",
    "shared-memory",
)


def _rank(name: str) -> int:
    return TABLE_ORDER.index(name) if name in TABLE_ORDER else len(TABLE_ORDER)


def _when(entry: dict[str, Any]) -> str:
    commit = (entry.get("commit") or "")[:7]
    if entry["status"] == "imported":
        return f"{commit}, imported" if commit else "no commit"
    return f"{commit}, {(entry.get('date') or '')[:10]}"


def render_table(entries: dict[str, dict[str, Any]]) -> str:
    """The README's results table (what lies between its markers), from the entries' headlines."""
    lines = [
        "## Measured results",
        "",
        "Generated from `benchmarks/results/` by `python scripts/gen_results.py render`; each row's "
        "section of docs/benchmarks.md says how it was measured. Ratios are milliserve's figure over "
        "the other side's, taken side by side in one run on a 2-vCPU VM shared with the load "
        "generator (absolute figures differ up to 3-4× between VMs).",
        "",
        "| measure | milliserve | against | ratio | section (commit) |",
        "|---|---|---|---|---|",
    ]
    for name, entry in sorted(entries.items(), key=lambda kv: (_rank(kv[0]), kv[0])):
        for row in entry.get("headline") or []:
            lines.append(
                f"| {row['measure']} | {row['milliserve']} | {row['against']} | {row['ratio']} "
                f"| `{name}` ({_when(entry)}) |"
            )
    unknown = sorted(n for n, e in entries.items() if not e.get("commit"))
    if unknown:
        lines += [
            "",
            "Sections that name no commit (unreproducible until re-run): " + ", ".join(unknown) + ".",
        ]
    return "\n".join(lines)


def place_table(text: str, table: str) -> str | None:
    """``text`` with the table between its markers, None where the markers are missing."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[: start + len(BEGIN)] + "\n" + table + "\n" + text[end:]


def render_readme(root: Path = ROOT) -> bool:
    """Write the README's results table from the store; whether it changed."""
    readme = root / README
    if not readme.exists():
        return False
    text = readme.read_text()
    new = place_table(text, render_table(load(root)))
    if new is None or new == text:
        return False
    readme.write_text(new)
    return True


def render(root: Path = ROOT) -> list[str]:
    """Write every doc section and the README table from the store; the files changed."""
    entries = load(root)
    changed = []
    for doc in sorted({e["doc"] for e in entries.values() if e.get("doc")}):
        path = root / doc
        text = path.read_text() if path.exists() else "# Benchmarks\n"
        new = text
        for entry in entries.values():
            if entry["doc"] == doc:
                new = place_block(new, entry)
        if new != text:
            path.write_text(new)
            changed.append(doc)
    if render_readme(root):
        changed.append(README)
    return changed


# ---- checking ----
@dataclass
class Findings:
    mismatches: list[str] = field(default_factory=list)  # always a failure
    stale: list[str] = field(default_factory=list)  # a warning, or a failure when strict


def mismatches(root: Path = ROOT) -> list[str]:
    """Where a doc or the README differs from what the store renders."""
    entries = load(root)
    out = []
    for name, entry in sorted(entries.items()):
        for key in ("section", "doc", "script", "status", "commit", "sources", "body"):
            if key not in entry:
                out.append(f"{RESULTS_DIR}/{name}.json: no {key!r}")
        if entry.get("doc") is None:
            continue  # figures no doc section holds (a script that prints its table)
        path = root / entry["doc"]
        if not path.is_file():
            out.append(f"{name}: its doc {entry.get('doc')} does not exist")
            continue
        if render_block(entry) not in path.read_text():
            out.append(
                f"{entry['doc']}: section {name!r} differs from the store ({RESULTS_DIR}/{name}.json); "
                "run `python scripts/gen_results.py render` (or its benchmark again)"
            )
    for doc in DOCS:
        path = root / doc
        if not path.is_file():
            continue
        for m in SECTION.finditer(path.read_text()):
            if m.group("name") not in entries:
                out.append(
                    f"{doc}: section {m.group('name')!r} has no entry in {RESULTS_DIR}/ "
                    "(its benchmark writes one; `python scripts/gen_results.py import` seeds it)"
                )
            elif entries[m.group("name")]["doc"] != doc:
                out.append(f"{doc}: section {m.group('name')!r} belongs to {entries[m.group('name')]['doc']}")
    readme = root / README
    if readme.is_file():
        text = readme.read_text()
        placed = place_table(text, render_table(entries))
        if placed is None:
            out.append(f"{README}: no {BEGIN} ... {END} markers for the results table")
        elif placed != text:
            out.append(
                f"{README}: the results table differs from the store; "
                "run `python scripts/gen_results.py render`"
            )
    return out


def staleness(entry: dict[str, Any], root: Path = ROOT) -> str | None:
    """Why ``entry``'s figures are stale, or None where its sources have not changed since."""
    name = entry["section"]
    commit = entry.get("commit")
    if not commit:
        return f"{name}: names no commit (imported from the docs): unreproducible until its script runs again"
    if resolve(commit, root) is None:
        return (
            f"{name}: measured at {commit[:7]}, which this history does not hold (a shallow clone?): "
            "cannot tell whether it is stale"
        )
    if entry.get("dirty"):
        return (
            f"{name}: measured at {commit[:7]} with uncommitted changes to what it measures: "
            f"re-run {entry['script']} from a clean checkout"
        )
    existing = list(entry.get("sources") or [])  # a path since deleted counts: git knows its history
    if not existing:
        return None
    last = _git(root, "log", "-1", "--format=%H", "--", *existing)
    if not last or last == commit or _git(root, "merge-base", "--is-ancestor", last, commit) is not None:
        return None
    changed = _git(root, "log", "--format=%h", f"{commit}..HEAD", "--", *existing) or ""
    paths = _git(root, "diff", "--name-only", commit, "HEAD", "--", *existing) or ""
    n = len(changed.split())
    shown = ", ".join(paths.split()[:4]) + (", ..." if len(paths.split()) > 4 else "")
    return (
        f"{name}: measured at {commit[:7]}; {n} later commit(s) changed what it measures ({shown}); "
        f"re-run {entry['script']}"
    )


def check(root: Path = ROOT) -> Findings:
    found = Findings(mismatches=mismatches(root))
    for _, entry in sorted(load(root).items()):
        why = staleness(entry, root)
        if why:
            found.stale.append(why)
    return found


# ---- seeding from the docs as they were ----
def import_docs(root: Path = ROOT, docs: tuple[str, ...] = DOCS) -> list[str]:
    """An ``imported`` entry for each doc section the store lacks, with the commit its text
    names (resolved to the full hash), or none; the names imported. An imported entry already
    there takes its script's SOURCES as they are now."""
    entries = load(root)
    done = []
    for doc in docs:
        path = root / doc
        if not path.is_file():
            continue
        for m in SECTION.finditer(path.read_text()):
            name = m.group("name")
            if name in entries:
                old = entries[name]
                if old["status"] == "imported" and old["sources"] != sources_for(old["script"]):
                    old["sources"] = sources_for(old["script"])  # SOURCES changed (a package moved)
                    save(old, root)
                    done.append(f"{name} (its sources)")
                continue
            stamp = re.match(r"^ by (\S+) sha256:", m.group("attrs"))
            script = stamp.group(1) if stamp else ""
            named = COMMIT_IN_BODY.search(m.group("body"))
            commit = resolve(named.group(1), root) if named else None
            entry: dict[str, Any] = {
                "schema": SCHEMA,
                "section": name,
                "doc": doc,
                "script": script,
                "command": None,
                "status": "imported",
                "commit": commit,
                "commit_named": named.group(1) if named else None,
                "dirty": None,
                "date": None,
                "machine": None,
                "versions": None,
                "settings": {},
                "rounds": None,
                "values": None,
                "summary": {},
                "headline": [],
                "sources": sources_for(script),
                "body": m.group("body"),
            }
            save(entry, root)
            entries[name] = entry
            done.append(name)
    return done


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    ap = argparse.ArgumentParser(prog="gen_results.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    sub.add_parser("render", help="write the docs' sections and the README table from the store")
    chk = sub.add_parser("check", help="fail where a doc differs from the store; list stale figures")
    chk.add_argument("--strict", action="store_true", help=f"stale figures fail too (or {STRICT_ENV}=1)")
    sub.add_parser("stale", help="list the stale sections")
    sub.add_parser("import", help="seed entries for doc sections the store lacks")
    args = ap.parse_args(argv)
    if args.cmd in (None, "render"):
        for path in render(root):
            print(f"wrote {path}")
        return 0
    if args.cmd == "import":
        for name in import_docs(root):
            print(f"imported {name}")
        return 0
    found = check(root)
    strict = args.cmd == "check" and (args.strict or os.environ.get(STRICT_ENV, "") not in ("", "0"))
    if found.stale:
        label = "STALE" if strict else "WARNING: stale"
        print(f"{label} figures ({len(found.stale)}; re-run their scripts):", file=sys.stderr)
        for line in found.stale:
            print(f"  {line}", file=sys.stderr)
    if args.cmd == "stale":
        return 0
    for line in found.mismatches:
        print(f"MISMATCH {line}", file=sys.stderr)
    return 1 if found.mismatches or (strict and found.stale) else 0


if __name__ == "__main__":
    sys.exit(main())
