"""The latency estimator behind deadline admission: it accounts for the request's size,
forgets old observations, and corrects itself after a slow period even though the
requests it refuses never run. Time is passed in explicitly, so nothing here sleeps."""

from __future__ import annotations

import pytest

from milliserve.runtime.deadline import LatencyEstimator


def test_nothing_known_is_none_and_the_prior_scales_up_with_work() -> None:
    assert LatencyEstimator().compute_s(1) is None
    est = LatencyEstimator(prior_s=0.010, prior_work=64)
    assert est.compute_s(64, now=0.0) == 0.010  # nothing seen: the load-time probe
    assert est.compute_s(32, now=0.0) == 0.010  # never scaled down
    assert est.compute_s(128, now=0.0) == pytest.approx(0.020)


def test_compute_follows_the_size_of_the_request() -> None:
    # a text model: 2 ms fixed + 0.1 ms per token; the estimator sees batches of several sizes
    est = LatencyEstimator()
    for t, work in enumerate([16, 64, 128, 16, 256, 32] * 3):
        est.observe(work, 0.002 + 0.0001 * work, now=t * 0.01)
    now = 0.2
    assert est.compute_s(16, now) == pytest.approx(0.0036, rel=0.01)
    assert est.compute_s(512, now) == pytest.approx(0.0532, rel=0.01)  # long: judged as long
    # the old estimator kept one average per batch size: a 512-token request was judged by short ones
    assert est.compute_s(512, now) > 10 * est.compute_s(16, now)


def test_one_size_seen_is_scaled_up_never_down() -> None:
    est = LatencyEstimator()
    est.observe(4, 0.010, now=0.0)
    assert est.compute_s(4, now=0.0) == pytest.approx(0.010)
    assert est.compute_s(8, now=0.0) == pytest.approx(0.020)
    assert est.compute_s(1, now=0.0) == pytest.approx(0.010)


def test_old_observations_fade_back_to_the_prior() -> None:
    est = LatencyEstimator(prior_s=0.001, prior_work=1)
    for i in range(50):  # a slow burst: 50 ms per request
        est.observe(1, 0.050, now=i * 0.001)
    assert est.compute_s(1, now=0.05) > 0.045
    # nothing observed since (every request refused): the estimate decays to the probe's
    assert est.compute_s(1, now=5.0) < 0.005
    assert est.compute_s(1, now=10.0) == pytest.approx(0.001, rel=0.01)


def test_a_fast_probe_corrects_a_stale_estimate_within_a_few_probes() -> None:
    est = LatencyEstimator(prior_s=0.001, prior_work=1)
    for i in range(200):
        est.observe(1, 0.100, now=i * 0.001)  # 100 ms per request while the machine was busy
    now = 0.2
    corrected = None
    for k in range(1, 20):  # the model is idle and refusing: a probe every ~250 ms runs
        now += 0.26
        assert est.probe(idle=True, now=now)
        est.observe(1, 0.001, now=now)
        if est.compute_s(1, now) < 0.005:
            corrected = k
            break
    assert corrected is not None and corrected <= 4, corrected  # ~1 s, not many half-lives


def test_probes_only_when_idle_and_rarely() -> None:
    est = LatencyEstimator(prior_s=0.01)
    assert not est.probe(idle=True, now=5.0)  # only the load-time probe: nothing to correct
    est.observe(1, 0.01, now=0.0)
    assert not est.probe(idle=True, now=0.1)  # observed recently
    assert not est.probe(idle=False, now=1.0)  # busy: its own requests will tell
    assert est.probe(idle=True, now=1.0)
    assert not est.probe(idle=True, now=1.1)  # at most one per interval
    assert est.probe(idle=True, now=1.3)
    assert est.probes == 2


def test_queue_estimate() -> None:
    est = LatencyEstimator()
    est.observe(4, 0.010, items=4, now=0.0)
    assert est.queue_s(queued_items=0, free_instances=1, instances=1, max_batch=4, now=0.0) == 0.0
    running = est.queue_s(queued_items=0, free_instances=0, instances=1, max_batch=4, now=0.0)
    assert running == pytest.approx(0.010, rel=0.1)
    # 8 queued = two full batches ahead, plus the running one
    three = est.queue_s(queued_items=8, free_instances=0, instances=1, max_batch=4, now=0.0)
    assert three == pytest.approx(3 * running)
    two = est.queue_s(queued_items=8, free_instances=0, instances=2, max_batch=4, now=0.0)
    assert two == pytest.approx(2 * running)
