"""The attack suite against a real server: every hostile input of issue 10 gets its 4xx /
INVALID_ARGUMENT (or, for the tokenizer, a truncated answer) within a bound, costs the
server no lasting memory, and a well-behaved client keeps being answered meanwhile.

The bounds are loose on purpose (a loaded 2-core CI machine): the failures they catch
were 43 s to 109 s freezes and gigabytes of RSS.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from milliserve.bench.attacks import ATTACKS, Attack, AttackResult, Target, run_attacks
from milliserve.testing import ServerProcess

# an attacker's worst answer, and the worst answer the good client saw meanwhile
ATTACK_BOUND_S = 20.0
STALL_BOUND_S = 5.0
RSS_BOUND = 300 << 20


@pytest.fixture(scope="module")
def results(example_repo: Path) -> Iterator[dict[str, tuple[Attack, AttackResult]]]:
    with ServerProcess(example_repo) as srv:
        assert srv.proc is not None
        target = Target("127.0.0.1", srv.http_port, srv.grpc_port, srv.proc.pid)
        found = run_attacks(target)
        assert srv.proc.poll() is None, "the server died:\n" + srv.logs()[-3000:]
        yield {a.name: (a, r) for a, r in zip(ATTACKS, found, strict=True)}
        logs = srv.logs()
    assert "Traceback" not in logs, logs[-3000:]  # every attack was expected, none was a bug


@pytest.mark.parametrize("name", [a.name for a in ATTACKS])
def test_attack_is_refused_and_contained(results: dict[str, tuple[Attack, AttackResult]], name: str) -> None:
    attack, r = results[name]
    assert set(r.statuses) <= attack.expect, f"{name}: got {dict(r.statuses)}, expected {set(attack.expect)}"
    assert r.worst_s < ATTACK_BOUND_S, f"{name}: the attacker waited {r.worst_s:.1f} s"
    assert r.good_failures == 0, f"{name}: {r.good_failures} good requests failed"
    assert r.good_requests > 0, f"{name}: the good client got no answer during the attack"
    assert r.good_worst_s < STALL_BOUND_S, f"{name}: a good request waited {r.good_worst_s:.1f} s"
    assert r.rss_growth < RSS_BOUND, f"{name}: RSS grew {r.rss_growth >> 20} MiB"
