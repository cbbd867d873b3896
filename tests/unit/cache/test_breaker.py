"""The Redis breaker: opens on a failure rate, not on one failure; half-opens after its
backoff, and one trial call closes or re-opens it; logs why, never an empty reason.
A fake clock makes the timing exact."""

from __future__ import annotations

import pytest

from milliserve.redis_client import Breaker, RedisTimeout, error_reason, failure_text


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_isolated_failures_leave_it_closed(clock: FakeClock) -> None:
    breaker = Breaker("thing", clock=clock)
    for _ in range(20):  # one failure every 0.3 s: at most 4 within any second
        breaker.failed(RedisTimeout(0.05))
        assert breaker.state == "closed" and breaker.allow()
        clock.now += 0.3
    assert breaker.errors == 20


def test_five_failures_within_a_second_open_it_for_the_backoff(clock: FakeClock) -> None:
    breaker = Breaker("thing", backoff_s=1.0, clock=clock)
    for _ in range(4):
        breaker.failed(ConnectionRefusedError())
        clock.now += 0.2
    assert breaker.state == "closed" and breaker.allow()
    breaker.failed(ConnectionRefusedError())  # the 5th within 0.8 s
    assert breaker.state == "open" and not breaker.allow() and not breaker.available
    clock.now += 0.99
    assert breaker.state == "open" and not breaker.allow()


def test_calls_that_fail_together_count_once(clock: FakeClock) -> None:
    breaker = Breaker("thing", clock=clock)
    for _ in range(4):  # 4 stalls within a second, each failing the 8 calls in flight
        started = clock.now
        clock.now += 0.05
        for _ in range(8):
            breaker.failed(RedisTimeout(0.05), started)
        clock.now += 0.1
    assert breaker.state == "closed" and breaker.errors == 32
    started = clock.now
    clock.now += 0.05
    breaker.failed(RedisTimeout(0.05), started)  # a 5th stall within the second
    assert breaker.state == "open"

    dead = Breaker("thing", clock=clock)
    for i in range(5):  # a dead Redis: each call starts after the last one failed, and counts
        assert dead.state == "closed", i
        started = clock.now
        clock.now += 0.001
        dead.failed(ConnectionRefusedError(), started)
    assert dead.state == "open"


def test_thresholds_are_parameters(clock: FakeClock) -> None:
    breaker = Breaker("thing", backoff_s=0.5, failures=2, window_s=0.1, clock=clock)
    breaker.failed(OSError("a"))
    clock.now += 0.2  # outside the window: the first no longer counts
    breaker.failed(OSError("b"))
    assert breaker.state == "closed"
    breaker.failed(OSError("c"))
    assert breaker.state == "open"
    with pytest.raises(ValueError, match="failures must be >= 1, got 0"):
        Breaker("thing", failures=0)


def _opened(clock: FakeClock) -> Breaker:
    breaker = Breaker("thing", backoff_s=1.0, clock=clock)
    for _ in range(5):
        breaker.failed(RedisTimeout(0.05))
    assert breaker.state == "open"
    return breaker


def test_after_the_backoff_one_trial_call_goes_through_and_success_closes_it(clock: FakeClock) -> None:
    breaker = _opened(clock)
    clock.now += 1.0
    assert breaker.state == "half-open" and breaker.available
    assert breaker.allow()  # the trial
    assert not breaker.allow() and not breaker.available  # everyone else waits for it
    breaker.succeeded()
    assert breaker.state == "closed"
    assert all(breaker.allow() for _ in range(10))


def test_a_failed_trial_opens_it_again(clock: FakeClock) -> None:
    breaker = _opened(clock)
    clock.now += 1.0
    assert breaker.allow()
    breaker.failed(ConnectionRefusedError())
    assert breaker.state == "open" and not breaker.allow()
    clock.now += 1.0
    assert breaker.allow()
    breaker.succeeded()
    assert breaker.state == "closed"


def test_late_reports_of_calls_from_before_it_opened_change_nothing(clock: FakeClock) -> None:
    breaker = _opened(clock)
    breaker.succeeded()  # a call admitted while closed answers late: still open
    breaker.failed(RedisTimeout(0.05))  # nor does a late failure extend the backoff
    assert breaker.state == "open"
    clock.now += 1.0
    assert breaker.state == "half-open"


def test_a_cancelled_or_lost_trial_does_not_block_the_next(clock: FakeClock) -> None:
    breaker = _opened(clock)
    clock.now += 1.0
    assert breaker.allow()
    breaker.abandoned()  # the request was cancelled: says nothing about Redis
    assert breaker.allow()  # so another caller tries
    clock.now += 1.0  # ... and never reports: after a while the trial is given up
    assert breaker.allow()
    breaker.succeeded()
    assert breaker.state == "closed"


def test_the_log_names_the_reason_at_most_once_per_interval(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    breaker = Breaker("response cache (redis)", backoff_s=1.0, log_interval_s=10.0, clock=clock)
    with caplog.at_level("INFO", logger="milliserve.redis_client"):
        breaker.failed(RedisTimeout(0.05))
        for _ in range(10):
            breaker.failed(ConnectionRefusedError(111, "Connection refused"))
        clock.now += 10.0
        assert breaker.allow()
        breaker.failed(RedisTimeout(0.05))  # the trial fails, after the log interval
        clock.now += 1.0
        breaker.allow()
        breaker.succeeded()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4, messages  # of 17 events: each kind once per 10 s
    assert messages[0].startswith("response cache (redis) call failed: timeout after 50 ms")
    assert "1 within 1 s; bypassed at 5" in messages[0]
    assert messages[1].startswith("response cache (redis) unavailable, bypassed for 1 s: connection refused")
    assert "5 failures within 1 s" in messages[1]
    assert "bypassed for 1 s: timeout after 50 ms (the trial call failed" in messages[2]
    assert messages[3] == "response cache (redis) is back after 11.0 s bypassed"


def test_failure_text_is_never_empty() -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    assert failure_text(RedisTimeout(0.05)) == "timeout after 50 ms"
    assert failure_text(RedisTimeout(0.0123)) == "timeout after 12.3 ms"
    assert failure_text(TimeoutError()) == "timeout"
    refused = RedisConnectionError("Error 111 connecting to 127.0.0.1:1.")
    refused.__context__ = ConnectionRefusedError(111, "Connect call failed")  # as redis-py raises it
    assert failure_text(refused) == "connection refused"
    assert failure_text(ValueError("bad reply")) == "ValueError: bad reply"
    assert failure_text(RuntimeError()) == "RuntimeError"
    assert error_reason(RedisTimeout(0.05)) == "timeout" and error_reason(OSError()) == "OSError"
