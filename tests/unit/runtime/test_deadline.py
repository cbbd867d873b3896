"""The latency estimator behind deadline admission."""

from __future__ import annotations

import pytest

from milliserve.runtime.deadline import LatencyEstimator


def test_estimates_follow_observations_per_batch_size() -> None:
    est = LatencyEstimator(prior_s=0.010)
    assert est.compute_s(1) == 0.010  # nothing seen: the load-time probe
    est.observe(1, 0.002)
    assert est.compute_s(1) == 0.002
    est.observe(1, 0.004)
    assert est.compute_s(1) == pytest.approx(0.0024)  # EWMA, alpha 0.2
    assert est.compute_s(4) == pytest.approx(0.0096)  # nearest seen, scaled up for a larger batch
    est.observe(8, 0.006)
    assert est.compute_s(6) == pytest.approx(0.006)  # 8 is nearer; never scaled down
    assert LatencyEstimator().compute_s(1) is None


def test_queue_estimate() -> None:
    est = LatencyEstimator()
    est.observe(4, 0.010)
    assert est.queue_s(queued_items=0, free_instances=1, instances=1, max_batch=4) == 0.0
    assert est.queue_s(queued_items=0, free_instances=0, instances=1, max_batch=4) == pytest.approx(0.010)
    # 8 queued = two full batches ahead, plus the running one
    assert est.queue_s(queued_items=8, free_instances=0, instances=1, max_batch=4) == pytest.approx(0.030)
    assert est.queue_s(queued_items=8, free_instances=0, instances=2, max_batch=4) == pytest.approx(0.020)
