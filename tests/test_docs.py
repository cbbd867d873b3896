"""The docs and the code agree (scripts/check_docs.py, also run by scripts/check): generated
sections untouched by hand, relative links alive, and every flag, setting and config field a
doc names one the code has. The second test shows the check failing on each kind of drift."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


check_docs = _load("check_docs", ROOT / "scripts" / "check_docs.py")
report_sections = sys.modules["report_sections"]  # check_docs put benchmarks/ on the path


def test_the_docs_and_the_code_agree() -> None:
    problems = check_docs.problems()
    assert not problems, "\n".join(problems)


def test_the_check_finds_each_kind_of_drift(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text("# Page\n\n## A heading\n\ntext\n")
    # a script that exists (run under pytest, the running script is pytest's, which a fresh
    # venv outside the repository does not hold)
    script = "benchmarks/overload.py"
    report_sections.write_section("fine", "## Fine\n\n| a | 1 |", doc, script)
    report_sections.write_section("edited", "## Edited\n\np50 100 µs", doc, script)
    text = doc.read_text().replace("p50 100 µs", "p50 90 µs")  # a hand edit
    text += "\n<!-- section:unstamped -->\nx\n<!-- /section:unstamped -->\n"
    text += "\nSee [the page](page.md#a-heading), [gone](nowhere.md) and [no anchor](page.md#no-such).\n"
    text += "\n```bash\nmilliserve serve repo --http-port 1 --no-such-flag\n"
    text += "python benchmarks/overload.py --nope\n```\n"
    text += "\nRun `milliserve bench URL --llm --bogus-flag` or give `--made-up N`.\n"
    text += "Set `MILLISERVE_HTTP__PORT` (fine) or `MILLISERVE_HTTP__NO_SUCH` (not).\n"
    doc.write_text(text)
    from milliserve.config.settings import Settings

    flags = check_docs.cli_flags()
    settings = check_docs._model_fields(Settings)
    strings = check_docs._source_strings()
    found = "\n".join(
        check_docs.check_sections(doc, text)
        + check_docs.check_links(doc, text)
        + check_docs.check_flags(doc, text, flags)
        + check_docs.check_env(doc, text, settings, strings)
    )
    assert "'edited' was edited by hand" in found and "'fine'" not in found
    assert "'unstamped' carries no 'by SCRIPT sha256:HASH' stamp" in found
    assert "'nowhere.md': no such file" in found and "'page.md#no-such': page.md has no heading" in found
    assert "a-heading" not in found
    assert "`milliserve serve` has no flag --no-such-flag" in found and "--http-port" not in found
    assert "benchmarks/overload.py has no flag --nope" in found
    assert "`milliserve bench` has no flag --bogus-flag" in found and "--llm" not in found
    assert "--made-up is not a flag of any milliserve command" in found
    assert "MILLISERVE_HTTP__NO_SUCH is neither" in found and "MILLISERVE_HTTP__PORT " not in found

    config = tmp_path / "configuration.md"
    config.write_text(
        "| field | meaning |\n|---|---|\n"
        "| `dynamic_batching.max_queue_delay_microseconds` | fine |\n"
        "| `budget {p99_ms, stages {parse, anything}}` | stages' keys are free |\n"
        "| `dynamic_batching.no_such_field` | not a field |\n\n"
        "| key | default | meaning |\n|---|---|---|\n"
        "| `intra_op_thread_count` | 1 | fine |\n| `no_such_parameter_xyz` | 1 | not |\n"
    )
    config.write_text(
        config.read_text()
        + "\n```protobuf\ndynamic_batching { target_p99_ms: 20 }\n```\n"
        + "\n```\nresponse_cache { enable: true ttl_days: 2 }\n```\n"
        + "\n```yaml\nmax_batch_size: 8\nbudget: {p99_ms: 50, stages: {queue: 5}}\nbatch_window_ms: 2\n```\n"
    )
    text = config.read_text()
    found = "\n".join(
        check_docs.check_config_fields(config, text, strings) + check_docs.check_config_blocks(config, text)
    )
    assert "'no_such_field' is not a field of the model config" in found
    assert "'no_such_parameter_xyz' is not a string of milliserve's source" in found
    assert "max_queue_delay" not in found and "anything" not in found and "intra_op" not in found
    assert 'has no field named "ttl_days"' in found and "target_p99_ms" not in found
    assert "'batch_window_ms' is not a field of the model config" in found and "'queue'" not in found
