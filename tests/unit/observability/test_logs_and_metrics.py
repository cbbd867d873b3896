"""Logging goes through a queue (never blocks the request path); metrics use an injected registry."""

from __future__ import annotations

import logging
import logging.handlers

from prometheus_client import CollectorRegistry, generate_latest

from milliserve.observability.logs import configure_logging
from milliserve.observability.metrics import Metrics
from milliserve.runtime.stats import ModelStats


def test_logging_is_handed_to_a_background_listener() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("DEBUG")
        assert [type(h) for h in root.handlers] == [logging.handlers.QueueHandler]
        assert root.level == logging.DEBUG
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


def test_two_servers_in_one_process_keep_separate_metrics() -> None:
    a_stats = ModelStats("m", "1")
    a_stats.record_batch(4, [1000] * 4, 10, 100, 10)
    a_stats.record_request(5000, None)
    a_stats.record_request(5000, "REJECTED")
    reg_a, reg_b = CollectorRegistry(), CollectorRegistry()
    Metrics(reg_a, lambda: [a_stats])
    Metrics(reg_b, lambda: [])
    text = generate_latest(reg_a).decode()
    assert 'milliserve_inference_count_total{model="m",version="1"} 4.0' in text
    assert 'milliserve_inference_exec_count_total{model="m",version="1"} 1.0' in text
    assert 'milliserve_inference_request_failure_total{model="m",reason="REJECTED",version="1"} 1.0' in text
    assert 'milliserve_batch_size_bucket{le="4.0",model="m",version="1"} 1.0' in text
    assert 'milliserve_queue_duration_seconds_count{model="m",version="1"} 4.0' in text
    assert "milliserve_inference_count_total{" not in generate_latest(reg_b).decode()
