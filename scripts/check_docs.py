#!/usr/bin/env python3
"""Do the docs and the code agree? Exit 1 naming each place where they do not.

- **Generated sections** (``<!-- section:NAME by SCRIPT sha256:HEX -->`` ...
  ``<!-- /section:NAME -->``, written by benchmarks/report_sections.py) must carry the
  script that writes them, that script must exist, and the hash of what is between the
  markers must match: a section edited by hand fails until its script is run again.
- **Relative links** in README.md and docs/*.md must reach a file, and a ``#anchor`` a
  heading of that file (GitHub's anchors).
- **Flags**: in every ``milliserve ...`` command of a code block or inline code, each
  ``--flag`` must be one that subcommand has (asked of the CLI's own parser); a flag alone
  in inline code must be one of milliserve's, or one of the few flags of other tools the
  docs name (OTHER_TOOLS); in every ``python benchmarks/X.py ...`` command each flag must
  be in that script.
- **Settings and config fields**: every ``MILLISERVE_...`` variable must be a server
  setting (``Settings``, ``__`` for nesting) or a variable the code reads by name; every
  field named in docs/configuration.md's field tables must be a field of the model config
  schema, and every key of its parameter tables a string the code knows; config snippets
  (Triton's text format, YAML) must use fields the config has.

    python scripts/check_docs.py        # or scripts/check; tests/test_docs.py runs it too
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from report_sections import section_digest  # noqa: E402

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# flags of other programs that the docs name in inline code, and whose they are
OTHER_TOOLS = {
    "--enable-unsafe-webgpu": "Chromium",
    "--engine": "infinity-emb's CLI (infinity_emb v2)",
    "--interrupt_requests": "llama-cpp-python's llama_cpp.server",
    "--stop-timeout": "docker run",
}

SECTION = re.compile(
    r"<!-- section:(?P<name>[\w.-]+)(?P<attrs>[^>]*?) -->\n(?P<body>.*?)\n<!-- /section:(?P=name) -->", re.S
)
OPENER = re.compile(r"<!-- section:([\w.-]+)[^>]*-->")
STAMP = re.compile(r"^ by (?P<script>\S+) sha256:(?P<hash>[0-9a-f]{16})$")
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\((?P<target>[^)\s]+)\)")
INLINE = re.compile(r"(`+)(?P<code>.+?)\1")
ENV = re.compile(r"\bMILLISERVE_[A-Z0-9_]+")


def _lines(text: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, line, inside a fenced code block), fences themselves left out."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        yield i, line, fenced


def _prose(line: str) -> str:
    return INLINE.sub(" ", line)


# ---- generated sections ----
def check_sections(path: Path, text: str) -> list[str]:
    out = []
    matched = {m.start() for m in SECTION.finditer(text)}
    for m in OPENER.finditer(text):
        if m.start() not in matched:
            out.append(f"{_where(path, text, m.start())}: section {m.group(1)!r} has no closing marker")
    for m in SECTION.finditer(text):
        where, name = _where(path, text, m.start()), m.group("name")
        stamp = STAMP.match(m.group("attrs"))
        if not stamp:
            out.append(f"{where}: section {name!r} carries no 'by SCRIPT sha256:HASH' stamp")
            continue
        if not (ROOT / stamp["script"]).is_file():
            out.append(f"{where}: section {name!r} says {stamp['script']} writes it: no such script")
        if section_digest(m.group("body")) != stamp["hash"]:
            out.append(
                f"{where}: section {name!r} was edited by hand (its hash does not match); "
                f"run {stamp['script']} again instead"
            )
    return out


def _where(path: Path, text: str, offset: int) -> str:
    return f"{_rel(path)}:{text.count(chr(10), 0, offset) + 1}"


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# ---- links ----
def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, punctuation dropped, spaces to -."""
    text = LINK.sub(lambda m: m.group("text"), heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line, fenced in _lines(path.read_text()):
        if fenced or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def check_links(path: Path, text: str) -> list[str]:
    out = []
    for n, line, fenced in _lines(text):
        if fenced:
            continue
        prose = _prose(line)
        targets = [m.group("target") for m in LINK.finditer(prose)]
        targets += [m.group("target") for m in IMAGE.finditer(prose)]
        for target in targets:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{_rel(path)}:{n}"
            if not dest.exists():
                out.append(f"{where}: link to {target!r}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                out.append(f"{where}: link to {target!r}: {dest.name} has no heading with that anchor")
    return out


# ---- flags ----
def cli_flags() -> dict[tuple[str, ...], set[str]]:
    """Every subcommand of ``milliserve`` (a path of names) and its flags."""
    from milliserve.cli.main import build_parser

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> dict[tuple[str, ...], set[str]]:
        out = {path: {s for a in p._actions for s in a.option_strings}}
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    out.update(walk(sub, (*path, name)))
        return out

    return walk(build_parser(), ())


def _commands(text: str) -> Iterator[tuple[int, list[str]]]:
    """Every shell command of the doc: lines of code blocks (continuations joined) and
    inline code spans, split at ``&&``, ``;``, ``|`` and parentheses, as token lists."""
    pending, start = "", 0
    for n, line, fenced in _lines(text):
        pieces = [line] if fenced else [m.group("code") for m in INLINE.finditer(line)]
        for piece in pieces:
            if fenced and piece.rstrip().endswith("\\"):
                pending, start = pending + piece.rstrip()[:-1] + " ", start or n
                continue
            full, first = pending + piece, start or n
            pending, start = "", 0
            for part in re.split(r"&&|\|\||;|\||\(|\)", full):
                tokens = part.replace("'", " ").replace('"', " ").split()
                if tokens:
                    yield first, tokens


def _milliserve_args(tokens: list[str]) -> list[str] | None:
    """The arguments of a ``milliserve`` command (``python -m milliserve``, a venv's
    ``milliserve``, after ``VAR=value`` assignments), or None for another program."""
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
        tokens = tokens[1:]
    if tokens and tokens[0].rsplit("/", 1)[-1] == "milliserve":
        return tokens[1:]
    python = bool(tokens) and tokens[0].rsplit("/", 1)[-1].startswith("python")
    if python and tokens[1:3] == ["-m", "milliserve"]:
        return tokens[3:]
    return None


def check_flags(path: Path, text: str, flags: dict[tuple[str, ...], set[str]]) -> list[str]:
    out = []
    every = set().union(*flags.values())
    scripts: dict[str, str] = {}
    lines = text.splitlines()
    for n, tokens in _commands(text):
        where = f"{_rel(path)}:{n}"
        given = [t.split("=", 1)[0] for t in tokens if t.startswith("--") and len(t) > 2]
        args = _milliserve_args(tokens)
        if args is not None:
            tokens = ["milliserve", *args]
            i = 1
            sub: tuple[str, ...] = ()
            while i < len(tokens) and (*sub, tokens[i]) in flags:
                sub, i = (*sub, tokens[i]), i + 1
            own = flags[sub] | flags[()]
            for f in given:
                if f not in own:
                    out.append(f"{where}: `milliserve {' '.join(sub)}` has no flag {f}")
            continue
        script = next((t for t in tokens if t.startswith("benchmarks/") and t.endswith(".py")), None)
        if script and (tokens[0].startswith("python") or tokens[0] == script):
            if not (ROOT / script).is_file():
                out.append(f"{where}: {script}: no such script")
                continue
            source = scripts.setdefault(script, _script_source(ROOT / script))
            for f in given:
                if f'"{f}"' not in source and f"'{f}'" not in source:
                    out.append(f"{where}: {script} has no flag {f}")
            continue
        if len(tokens) <= 3 and tokens[0].startswith("--"):  # a flag alone: `--workers N`
            f = tokens[0].split("=", 1)[0]
            named = re.findall(r"benchmarks/[\w/]+\.py", lines[n - 1])  # "benchmarks/x.py `--rounds 3`"
            of_script = any(
                (ROOT / s).is_file() and f'"{f}"' in scripts.setdefault(s, _script_source(ROOT / s))
                for s in named
            )
            if f not in every and f not in OTHER_TOOLS and not of_script:
                out.append(f"{where}: {f} is not a flag of any milliserve command")
    return out


def _script_source(path: Path) -> str:
    """A benchmark script's text with that of the sibling modules it imports (argparse
    helpers shared between scripts)."""
    text = path.read_text()
    for m in re.finditer(r"^from (\w+) import", text, re.M):
        sibling = path.parent / f"{m.group(1)}.py"
        if sibling.is_file():
            text += sibling.read_text()
    return text


# ---- settings and config fields ----
def _model_fields(model: Any, prefix: str = "") -> dict[str, Any]:
    """``a__b`` paths of a pydantic settings tree, each with its annotation."""
    out = {}
    for name, field in model.model_fields.items():
        out[prefix + name] = field.annotation
        sub = field.annotation
        if isinstance(sub, type) and hasattr(sub, "model_fields"):
            out.update(_model_fields(sub, f"{prefix}{name}__"))
    return out


def _source_strings() -> set[str]:
    """Every string literal of milliserve's source and of its benchmark scripts (the results
    store reads MILLISERVE_RESULTS_STRICT)."""
    out = set()
    for p in [*(ROOT / "src" / "milliserve").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.add(node.value)
    return out


def check_env(path: Path, text: str, settings: dict[str, Any], strings: set[str]) -> list[str]:
    out = []
    for n, line, _ in _lines(text):
        for m in ENV.finditer(line):
            name = m.group(0).rstrip("_")
            key = name.removeprefix("MILLISERVE_").lower()
            if key in settings or name in strings or not key:
                continue
            out.append(f"{_rel(path)}:{n}: {name} is neither a server setting nor read by the code")
    return out


def _schema_fields() -> tuple[set[str], set[str]]:
    """Every field name of the model config schema, and those that hold a mapping (their
    keys are free: ``stages {queue, infer}``, ``parameters``)."""
    from pydantic import BaseModel

    from milliserve.config import model_config, sequence_batching, step_config

    names: set[str] = set()
    mappings: set[str] = set()
    seen: set[type] = set()

    def visit(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            names.add(name)
            names.update(a for a in (field.alias, field.validation_alias) if isinstance(a, str))
            for t in _types(field.annotation):
                if t is dict:
                    mappings.add(name)
                elif isinstance(t, type) and issubclass(t, BaseModel):
                    visit(t)

    for module in (model_config, sequence_batching, step_config):
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseModel)
                and value.__module__ == module.__name__
            ):
                visit(value)
    return names, mappings


def _types(annotation: Any) -> Iterator[Any]:
    origin = typing.get_origin(annotation)
    if origin is None:
        yield annotation
        return
    yield origin
    for arg in typing.get_args(annotation):
        yield from _types(arg)


def check_config_fields(path: Path, text: str, strings: set[str]) -> list[str]:
    """docs/configuration.md's tables: `field` tables name schema fields; `key` and
    `parameter` tables name parameter keys the code knows."""
    names, mappings = _schema_fields()
    out = []
    header: list[str] = []
    for n, line, fenced in _lines(text):
        if fenced or not line.startswith("|"):
            header = []
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header:
            header = cells
            continue
        if set(line) <= set("|-: ") or not cells or header[0] not in ("field", "key", "parameter"):
            continue
        where = f"{_rel(path)}:{n}"
        for m in INLINE.finditer(cells[0]):
            code = m.group("code")
            if header[0] != "field":
                for key in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code):
                    if key not in strings:
                        out.append(f"{where}: parameter {key!r} is not a string of milliserve's source")
                continue
            skip_depth = None
            depth = 0
            last = ""
            for token in re.findall(r"[A-Za-z_][A-Za-z0-9_]*|[{}\[\]]", code):
                if token in "{[":
                    depth += 1
                    if skip_depth is None and last in mappings:
                        skip_depth = depth
                elif token in "}]":
                    if skip_depth == depth:
                        skip_depth = None
                    depth -= 1
                elif skip_depth is None:
                    if token not in names and not token.isupper():  # TYPE_FP32, KIND_CPU: values
                        out.append(f"{where}: {token!r} is not a field of the model config")
                    last = token
    return out


def _blocks(text: str) -> Iterator[tuple[int, str, str]]:
    """(first line, language tag, text) of each fenced code block."""
    lines: list[str] | None = None
    start, lang = 0, ""
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if lines is None:
                lines, start, lang = [], n + 1, line.strip()[3:].strip()
            else:
                yield start, lang, "\n".join(lines)
                lines = None
        elif lines is not None:
            lines.append(line)


PBTXT_START = re.compile(r'^\s*[a-z_][a-z0-9_]*\s*(\{|:\s*("|-?[0-9]|[A-Z_]+\s*$|true|false))')


def check_config_blocks(path: Path, text: str) -> list[str]:
    """Config snippets: a ``protobuf`` block, or an untagged one that reads as Triton's text
    format, must parse as milliserve's ModelConfig message (a field it lacks is an error);
    the keys of a ``yaml`` block must be fields of the model config schema."""
    import yaml
    from google.protobuf import text_format

    from milliserve.protocol.proto import oip_pb2

    names, mappings = _schema_fields()
    out = []
    for n, lang, block in _blocks(text):
        where = f"{_rel(path)}:{n}"
        first = next((ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")
        if lang in ("protobuf", "pbtxt") or (not lang and PBTXT_START.match(first)):
            try:
                text_format.Parse(block, oip_pb2.ModelConfig())
            except text_format.ParseError as exc:
                out.append(
                    f"{where}: not a config milliserve reads: {str(exc).replace('milliserve.oip.v2.', '')}"
                )
        elif lang in ("yaml", "yml"):
            try:
                doc = yaml.safe_load(block)
            except yaml.YAMLError as exc:
                out.append(f"{where}: invalid YAML: {exc}")
                continue
            for key in _yaml_keys(doc, mappings):
                if key not in names:
                    out.append(f"{where}: {key!r} is not a field of the model config")
    return out


def _yaml_keys(doc: Any, mappings: set[str]) -> Iterator[str]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield str(k)
            if str(k) not in mappings:
                yield from _yaml_keys(v, mappings)
    elif isinstance(doc, list):
        for v in doc:
            yield from _yaml_keys(v, mappings)


def problems() -> list[str]:
    flags = cli_flags()
    from milliserve.config.settings import Settings

    settings = _model_fields(Settings)
    strings = _source_strings()
    out = []
    for path in DOCS:
        text = path.read_text()
        out += check_sections(path, text)
        out += check_links(path, text)
        out += check_flags(path, text, flags)
        out += check_env(path, text, settings, strings)
        out += check_config_blocks(path, text)
        if path.name == "configuration.md":
            out += check_config_fields(path, text, strings)
    return out


def main() -> int:
    found = problems()
    for p in found:
        print(p)
    print(f"{len(found)} place(s) where the docs and the code disagree" if found else "docs and code agree")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
