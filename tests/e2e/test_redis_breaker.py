"""A Redis response cache under steady load from 4 client threads: a healthy, merely busy
Redis (another client's 10 ms command every 100 ms) keeps answering (issue 10: one 5 ms
timeout used to bypass it for a second, and the hit ratio fell to 0.05), and a Redis
killed and restarted on the same port costs no request, with hits coming back by
themselves. benchmarks/redis_cache_drill.py runs the same drill and reports the figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from milliserve.drills.cache_drill import Load, Stalls, cache_counts, write_add_sub
from milliserve.testing import RedisServer, ServerProcess, wait_until

pytestmark = pytest.mark.e2e


def test_busy_redis_keeps_its_hit_ratio_and_a_restart_fails_no_request(tmp_path: Path) -> None:
    write_add_sub(tmp_path)
    redis_server = RedisServer()
    redis_server.start()
    try:
        with ServerProcess(tmp_path, "--redis-url", redis_server.url) as server:
            with Load(server.http_url, threads=4) as load:
                load.wait_sent(len(load.inputs), timeout_s=60)  # each input seen about once: warm
                with Stalls(redis_server.url) as stalls:  # 10 ms stalls: a 5 ms bound trips on each
                    before = cache_counts(server.http_url)
                    load.wait_sent(load.sent + 1000, timeout_s=120)
                    after = cache_counts(server.http_url)
                assert stalls.count > 0
                hits, misses = after[0] - before[0], after[1] - before[1]
                ratio = hits / max(1, hits + misses)
                assert ratio >= 0.9, f"hit ratio {ratio:.3f} ({hits} hits, {misses} misses), expected >= 0.9"

                redis_server.stop()
                load.wait_sent(load.sent + 200, timeout_s=60)  # served while Redis is down
                redis_server = RedisServer(port=redis_server.port)  # same port, empty
                redis_server.start()
                back = cache_counts(server.http_url)[0]
                wait_until(
                    lambda: cache_counts(server.http_url)[0] >= back + 20, 15, "hits after the restart"
                )
            assert load.failed == 0, f"{load.failed} of {load.sent} requests failed: {load.errors}"
            assert load.wrong == 0, f"{load.wrong} of {load.sent} answers were wrong"
        assert "response cache (redis) unavailable, bypassed for 1 s: connection refused" in server.logs()
    finally:
        redis_server.stop()
