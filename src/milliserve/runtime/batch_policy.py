"""A model version's batching and queueing rules (its config's ``dynamic_batching``, as
Triton reads it): the batch sizes it may form and prefers, how long a batch may wait for
company, priority levels, the queue's bound and the per-request timeout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from milliserve.errors import InvalidInputError

__all__ = ["BatchPolicy"]


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """Batching and queueing rules of one model version."""

    label: str
    merge: bool = False  # dynamic batching on: requests may share a batch
    max_batch_size: int = 1
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_s: float = 0.0
    priority_levels: int = 0
    default_priority_level: int = 0
    max_queue_size: int = 0
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    delay_on_timeout: bool = False  # timeout_action DELAY instead of REJECT

    def target_batch(self) -> int:
        return max(self.preferred_batch_sizes) if self.preferred_batch_sizes else self.max_batch_size

    def priority_index(self, requested: Any) -> int:
        """Queue index for a request's ``priority`` parameter (0 = config default)."""
        if not self.priority_levels:
            return 0
        level = requested if requested else self.default_priority_level
        if not isinstance(level, int) or isinstance(level, bool) or not 1 <= level <= self.priority_levels:
            raise InvalidInputError(
                f"parameter 'priority' must be an integer in 1..{self.priority_levels} for model "
                f"{self.label!r}, got {requested!r}"
            )
        return level - 1

    def timeout_s(self, requested: Any) -> float | None:
        """The queue timeout for a request's ``timeout`` parameter (µs), or None for none."""
        us = self.default_timeout_us
        if requested is not None:
            if not isinstance(requested, int) or isinstance(requested, bool) or requested < 0:
                raise InvalidInputError(
                    f"parameter 'timeout' must be a non-negative integer (microseconds), got {requested!r}"
                )
            if self.allow_timeout_override or not us or requested < us:
                us = requested
        return us / 1e6 if us else None
