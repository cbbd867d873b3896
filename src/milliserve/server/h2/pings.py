"""PING (RFC 9113 §6.7) both ways: the client's, answered within a budget of strikes (ping
floods, CVE-2019-9512), and the server's keepalive, which finds clients that vanished
without a FIN."""

from __future__ import annotations

from collections.abc import Callable

from milliserve.server.h2.answers import Answers
from milliserve.server.h2.frames import (
    ACK,
    FRAME_SIZE_ERROR,
    PING,
    PROTOCOL_ERROR,
    Http2Calm,
    Http2ConnectionError,
    frame,
)
from milliserve.server.h2.limits import Http2Limits

__all__ = ["Pings"]


class Pings:
    """One connection's pings: the client's strikes, and the keepalive ping in flight."""

    __slots__ = ("_answers", "_clock", "_keepalive_sent", "_last_ping", "_limits", "_strikes", "_write")

    def __init__(
        self,
        limits: Http2Limits,
        answers: Answers,
        clock: Callable[[], float],
        write: Callable[[bytes], None],
    ) -> None:
        self._limits = limits
        self._answers = answers  # whether answer data went out since the last PING
        self._clock = clock
        self._write = write
        self._strikes = 0
        self._last_ping = 0.0
        self._keepalive_sent = 0.0  # when the unanswered keepalive ping went out; 0: none

    def received(self, flags: int, sid: int, payload: bytes) -> None:
        """A PING from the client: answered, or acknowledging the server's keepalive."""
        if sid != 0:
            raise Http2ConnectionError(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise Http2ConnectionError(FRAME_SIZE_ERROR, "PING of the wrong size")
        if flags & ACK:
            self._keepalive_sent = 0.0
            return
        now = self._clock()
        # as grpc core: a ping soon after another, with no answer data sent between them, is
        # a strike; past max_ping_strikes the connection ends (ping floods, CVE-2019-9512)
        answers = self._answers
        if not answers.sent_data and now - self._last_ping < self._limits.min_ping_interval_s:
            self._strikes += 1
            if self._strikes > self._limits.max_ping_strikes:
                raise Http2Calm("too_many_pings")  # the text grpc clients back off on
        elif answers.sent_data:
            self._strikes = 0
        self._last_ping = now
        answers.sent_data = False
        self._write(frame(PING, ACK, 0, payload))

    def keepalive(self, now: float, last_recv: float) -> bool:
        """Each second of the connection's timer: a PING once the client has sent nothing for
        ``keepalive_time_s``. False if the last one went unanswered for ``keepalive_timeout_s``
        (the peer vanished without a FIN)."""
        sent = self._keepalive_sent
        if sent and now - sent > self._limits.keepalive_timeout_s:
            return False
        if not sent and now - last_recv > self._limits.keepalive_time_s:
            self._keepalive_sent = now
            self._write(frame(PING, 0, 0, b"keepaliv"))
        return True
