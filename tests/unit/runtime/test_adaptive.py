"""Budget-driven batching: the controller moves the batch cap and queue delay to keep
queue + compute p99 under the target."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from milliserve.config.model_config import DynamicBatching
from milliserve.runtime.adaptive import AdaptiveBatching
from milliserve.runtime.batch_policy import BatchPolicy


def _controller(delay_s: float = 0.001, **kw: Any) -> tuple[AdaptiveBatching, Any]:
    base = BatchPolicy(
        "m", merge=True, max_batch_size=32, preferred_batch_sizes=(8, 32), max_queue_delay_s=delay_s
    )
    batcher = SimpleNamespace(policy=base, busy_s=0.0)
    return AdaptiveBatching(batcher, base, target_s=0.020, interval_s=0.0, **kw), batcher  # type: ignore[arg-type]


def test_slow_batches_shrink_the_cap_then_it_recovers_under_the_target() -> None:
    ctl, batcher = _controller()
    for _ in range(20):
        ctl.observe(0.0, 0.030)  # compute alone 30 ms > 20 ms target: batches too big for an idle instance
    assert batcher.policy.max_batch_size == 22 and batcher.policy.max_queue_delay_s == 0.001  # its floor
    assert batcher.policy.preferred_batch_sizes == (8,)  # 32 no longer fits under the cap
    for _ in range(20):
        ctl.observe(0.0, 0.030)
    assert batcher.policy.max_batch_size == 15
    for _ in range(400):
        batcher.busy_s += 1.0  # the instance is always running: fuller batches pay
        ctl.observe(0.001, 0.004)  # well under: grow again, step by step, never past the limits
    assert batcher.policy.max_batch_size == 32
    assert batcher.policy.max_queue_delay_s == 0.005  # a quarter of the target at most
    assert ctl.adjustments >= 3


def test_with_idle_instances_a_delay_only_adds_latency() -> None:
    ctl, batcher = _controller(delay_s=0.0)
    assert batcher.policy.max_queue_delay_s == 0.0001  # a 100 µs window to start with
    for _ in range(200):
        batcher.busy_s += 1.0
        ctl.observe(0.001, 0.004)  # saturated and well under the target: a longer wait pays
    assert batcher.policy.max_queue_delay_s > 0.001
    for _ in range(400):
        ctl.observe(0.001, 0.004)  # well under the target, and the instance mostly idle
    assert batcher.policy.max_queue_delay_s == 0.0001  # back to the short window, no longer
    assert batcher.policy.max_batch_size == 32


def test_holds_in_the_comfort_band_and_waits_for_enough_samples() -> None:
    ctl, batcher = _controller()
    for _ in range(19):
        ctl.observe(0.050, 0.050)
    assert batcher.policy.max_batch_size == 32  # 19 samples: not enough to judge
    ctl.samples.clear()
    for _ in range(40):
        ctl.observe(0.006, 0.010)  # 80% of the target: hold
    assert batcher.policy.max_batch_size == 32 and ctl.adjustments == 0


def test_config_field() -> None:
    assert DynamicBatching(target_p99_ms=20).target_p99_ms == 20
    assert DynamicBatching(target_p99_ms=0).target_p99_ms is None  # protobuf's unset default


def test_queueing_over_the_target_grows_the_cap_for_throughput() -> None:
    ctl, batcher = _controller()
    ctl.cap = 4
    ctl._apply()
    for _ in range(20):
        ctl.observe(0.040, 0.005)  # the time is queueing, compute is cheap: batch more
    assert batcher.policy.max_batch_size == 8
    for _ in range(40):
        ctl.observe(0.040, 0.005)
    assert batcher.policy.max_batch_size == 32  # doubling, up to max_batch_size


def test_a_saturated_instance_keeps_its_cap_when_the_target_is_out_of_reach() -> None:
    ctl, batcher = _controller()
    for _ in range(100):
        batcher.busy_s += 1.0  # always running: a smaller cap would only cut throughput
        ctl.observe(0.005, 0.030)  # over the target, compute-bound, short queue
    assert batcher.policy.max_batch_size == 32
