"""``Soon``: a result that comes later in the event loop's turn, without a future.

The express lane under load (``LoopTurn.join``) answers the requests of one loop
turn together, once every socket that was ready has been read. A front end that took one
of them gets a ``Soon`` and names what to do with the result (``then``); the batch settles
it. No task, future or wake-up is made per request: both sides run on the loop's thread,
and the callback runs inside ``settle``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Soon"]

T = TypeVar("T")
U = TypeVar("U")
_UNSET = object()


class Soon(Generic[T]):
    """A value of type ``T``, or the exception that took its place, delivered once."""

    __slots__ = ("_then", "_value")

    def __init__(self) -> None:
        self._then: Callable[[T | BaseException], None] | None = None
        self._value: object = _UNSET

    def then(self, fn: Callable[[T | BaseException], None]) -> None:
        """Call ``fn`` with the result when it comes (at once if it has)."""
        if self._value is _UNSET:
            self._then = fn
        else:
            fn(self._value)  # type: ignore[arg-type]

    def map(self, fn: Callable[[T], U], on_error: Callable[[BaseException], U | BaseException]) -> Soon[U]:
        """A ``Soon`` of ``fn(result)``, or of ``on_error(exception)`` (which may give an
        exception to pass on). An exception ``fn`` raises is passed on in its place."""
        out: Soon[U] = Soon()

        def settle(value: T | BaseException) -> None:
            mapped: U | BaseException
            try:
                mapped = on_error(value) if isinstance(value, BaseException) else fn(value)
            except Exception as exc:
                mapped = exc
            out.settle(mapped)

        self.then(settle)
        return out

    def settle(self, value: T | BaseException) -> None:
        """Deliver the result (or an exception in its place)."""
        if self._value is not _UNSET:
            raise RuntimeError("a Soon was settled twice")
        self._value = value
        fn = self._then
        if fn is not None:
            self._then = None
            fn(value)
