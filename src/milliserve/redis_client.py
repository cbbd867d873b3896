"""The one way milliserve opens Redis: redis-py's asyncio client (hiredis parses replies
when installed), every call bounded by the configured timeout and by what is left of the
request's deadline, a connection broken by a Redis restart redialled once, at once,
inside the same call; and the breaker that keeps a failing Redis out of the request path.

The breaker opens on a failure rate, not on one failure: a healthy Redis on a busy
machine misses a timeout now and then, and bypassing it for a whole backoff after each
such miss threw most of the cache away (issue 10). Calls that fail together (all those
in flight when Redis, or this process, stalled) count once. While open it skips Redis for
``backoff_s``; then one trial call goes through (half-open): success closes it, failure
opens it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

__all__ = ["BoundedRedis", "Breaker", "RedisTimeout", "error_reason", "failure_text", "redis_client"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# redis-py's own socket timeouts only back up asyncio.wait_for, which bounds each call:
# they close a socket that something left waiting, never a request's bound.
BACKSTOP_S = 1.0


class RedisTimeout(TimeoutError):
    """A Redis call that did not answer within its bound (the configured timeout, or what
    was left of the request's deadline when that was shorter)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"timeout after {timeout_s * 1000:.3g} ms")
        self.timeout_s = timeout_s


def error_reason(exc: BaseException) -> str:
    """A metric label for a failed call: ``timeout`` or the exception's class name."""
    return "timeout" if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) else type(exc).__name__


def failure_text(exc: BaseException) -> str:
    """Why a call failed, for a log line; never empty: ``timeout after 50 ms``,
    ``connection refused``, or the exception's class and text."""
    seen: BaseException | None = exc
    while seen is not None:  # redis-py wraps the OSError of a refused connect
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    if isinstance(exc, RedisTimeout):
        return text
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) and not text:
        return "timeout"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Breaker:
    """Keeps a failing dependency out of the request path.

    Closed: every call goes through. ``failures`` failures within ``window_s`` open it;
    calls that were in flight together and fail together (one stall of Redis, or of this
    process's event loop) count as one.
    Open: calls are skipped for ``backoff_s``. Half-open: one trial call goes through
    (``allow()`` says yes to one caller); ``succeeded()`` closes the breaker,
    ``failed()`` opens it again. Callers report each call they were allowed: success,
    failure, or ``abandoned()`` (cancelled, says nothing about the dependency).
    Each kind of message (a failure, the breaker opening, Redis back) is logged, with
    its reason, at most once per ``log_interval_s``.
    ``clock`` (seconds, monotonic) is there for tests.
    """

    def __init__(
        self,
        what: str,
        backoff_s: float = 1.0,
        log_interval_s: float = 10.0,
        *,
        failures: int = 5,
        window_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 1:
            raise ValueError(f"breaker failures must be >= 1, got {failures}")
        self.what, self.backoff_s, self.log_interval_s = what, backoff_s, log_interval_s
        self.failures, self.window_s, self.clock = failures, window_s, clock
        self.errors = 0  # every failure reported, for logs and tests
        self._recent: deque[float] = deque()  # times of the failures within the window
        self._open_until: float | None = None  # None: closed
        self._trial_since: float | None = None  # half-open with a trial call out
        self._down_since = 0.0  # when it last opened from closed
        self._last_failure = float("-inf")  # when the last counted failure was reported
        self._last_log: dict[str, float] = {}  # by message: failed, open, back

    @property
    def state(self) -> Literal["closed", "open", "half-open"]:
        if self._open_until is None:
            return "closed"
        return "open" if self.clock() < self._open_until else "half-open"

    @property
    def available(self) -> bool:
        """Whether a call would go through now (without taking the half-open trial)."""
        return self.state == "closed" or (self.state == "half-open" and not self._trial_out())

    def allow(self) -> bool:
        """Whether this call may go to the dependency; in half-open, yes to one trial."""
        state = self.state
        if state == "closed":
            return True
        if state == "open" or self._trial_out():
            return False
        self._trial_since = self.clock()
        return True

    def succeeded(self) -> None:
        if self._trial_since is None:  # closed, or a call from before it opened
            return
        now = self.clock()
        down_s = now - self._down_since
        self._open_until = self._trial_since = None
        if self._may_log("back", now):
            log.info("%s is back after %.1f s bypassed", self.what, down_s)

    def failed(self, exc: BaseException, started: float | None = None) -> None:
        """Report a failed call; ``started`` (on ``clock``) is when it began, if known: a
        call that began before the last counted failure overlapped it, and adds nothing."""
        self.errors += 1
        now = self.clock()
        if self._open_until is not None:
            if self._trial_since is not None:  # the half-open trial failed: open again
                self._trial_since = None
                self._open(now, exc, "the trial call failed")
            return  # else a call from before it opened: it is open already
        if started is not None and started < self._last_failure:
            return  # in flight with the last counted failure: the same stall
        self._last_failure = now
        self._recent.append(now)
        while self._recent[0] <= now - self.window_s:
            self._recent.popleft()
        if len(self._recent) >= self.failures:
            self._down_since = now
            self._open(now, exc, f"{len(self._recent)} failures within {self.window_s:g} s")
        elif self._may_log("failed", now):
            log.warning(
                "%s call failed: %s (%d within %g s; bypassed at %d; %d errors so far)",
                self.what,
                failure_text(exc),
                len(self._recent),
                self.window_s,
                self.failures,
                self.errors,
            )

    def abandoned(self) -> None:
        """An allowed call ended without an answer either way (cancelled by its caller)."""
        self._trial_since = None

    def _open(self, now: float, exc: BaseException, why: str) -> None:
        self._open_until = now + self.backoff_s
        self._recent.clear()
        if self._may_log("open", now):
            log.warning(
                "%s unavailable, bypassed for %g s: %s (%s; %d errors so far)",
                self.what,
                self.backoff_s,
                failure_text(exc),
                why,
                self.errors,
            )

    def _trial_out(self) -> bool:
        # A trial whose caller never reported (lost) no longer blocks the next one.
        return self._trial_since is not None and self.clock() - self._trial_since < max(
            self.backoff_s, BACKSTOP_S
        )

    def _may_log(self, kind: str, now: float) -> bool:
        if now - self._last_log.get(kind, -1e18) < self.log_interval_s:
            return False
        self._last_log[kind] = now
        return True


def redis_client(url: str, timeout_s: float) -> Any:
    """A redis-py asyncio client for ``url``. Callers bound each call with ``timeout_s``
    (asyncio.wait_for); the client's socket timeouts are a backstop, at least 1 s."""
    import redis.asyncio as aredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    backstop = max(timeout_s, BACKSTOP_S)
    return aredis.Redis.from_url(
        url,
        socket_timeout=backstop,
        socket_connect_timeout=backstop,
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[RedisConnectionError],
    )


class BoundedRedis:
    """A Redis client whose calls are bounded and guarded by a breaker.

    ``admit(deadline)`` gives the bound for the next call, or None when it should not be
    made (the breaker is open, or the request has no time left: not a failure); then
    ``call(aw, timeout_s)`` awaits it and reports the outcome to the breaker. A call cut
    short is cancelled, and redis-py drops that connection rather than reuse it.
    """

    def __init__(self, url: str, what: str, timeout_s: float, backoff_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.client = redis_client(url, timeout_s)
        self.breaker = Breaker(what, backoff_s)

    def admit(self, deadline: float | None) -> float | None:
        """The timeout for a call now: the configured one, cut to ``deadline`` (an absolute
        ``time.perf_counter()``) when that is sooner; None to skip the call."""
        timeout = self.timeout_s
        if deadline is not None:
            timeout = min(timeout, deadline - time.perf_counter())
            if timeout <= 0:
                return None
        return timeout if self.breaker.allow() else None

    async def call(self, aw: Awaitable[T], timeout_s: float) -> T:
        """The call's result; raises RedisTimeout or redis-py's error (already reported)."""
        started = self.breaker.clock()
        try:
            result = await asyncio.wait_for(aw, timeout_s)
        except TimeoutError:
            exc = RedisTimeout(timeout_s)
            self.breaker.failed(exc, started)
            raise exc from None
        except asyncio.CancelledError:
            self.breaker.abandoned()
            raise
        except Exception as exc:
            self.breaker.failed(exc, started)
            raise
        self.breaker.succeeded()
        return result

    async def close(self) -> None:
        await self.client.aclose()
