"""Reading OpenAI-style chunks: what is a content chunk, how tokens are counted, and what
a server adds (errors inside the stream, usage, timings)."""

from __future__ import annotations

import orjson

from milliserve.bench.llm_stream import StreamTally, parse_server_timing
from milliserve.bench.sse import SseEvent


def ev(doc: object, t: float = 0.0) -> SseEvent:
    return SseEvent(doc if isinstance(doc, str) else orjson.dumps(doc).decode(), t)


def chat(text: str | None, **extra: object) -> dict[str, object]:
    delta = {} if text is None else {"content": text}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra}


def test_the_role_chunk_and_empty_content_are_not_tokens_and_usage_counts_them() -> None:
    t = StreamTally()
    t.add(ev({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, 1.0))
    t.add(ev(chat("Hello"), 2.0))
    t.add(ev(chat(None), 2.5))  # a delta with nothing in it
    t.add(ev(chat(" world"), 3.0))
    t.add(ev({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}, 3.1))
    assert t.output_tokens == 2  # no usage yet: one per content chunk
    t.add(ev({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}}, 3.2))
    t.add(ev("[DONE]", 3.3))
    assert t.chunk_times == [2.0, 3.0]
    assert t.output_tokens == 5 and t.prompt_tokens == 9  # the server's count wins
    assert t.per_chunk_tokens() == [2.5, 2.5]  # spread evenly: the server did not say per chunk
    assert t.done and t.finish_reason == "length" and t.error is None


def test_cumulative_usage_on_each_chunk_gives_each_chunk_its_own_count() -> None:
    t = StreamTally()
    for i, used in enumerate([1, 4, 5]):
        t.add(ev(chat("x", usage={"prompt_tokens": 3, "completion_tokens": used}), float(i)))
    assert t.per_chunk_tokens() == [1.0, 3.0, 1.0] and t.output_tokens == 5


def test_completions_text_and_reasoning_content_are_content() -> None:
    t = StreamTally()
    t.add(ev({"choices": [{"index": 0, "text": "Once", "finish_reason": None}]}, 1.0))
    t.add(ev({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]}, 2.0))
    t.add(ev({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}, 3.0))
    assert t.chunk_times == [1.0, 2.0] and t.finish_reason == "stop"


def test_an_error_inside_the_stream_is_kept_and_junk_is_counted() -> None:
    t = StreamTally()
    t.add(ev(chat("a"), 1.0))
    t.add(ev("not json", 1.5))
    t.add(ev({"error": {"message": "out of KV cache", "type": "server_error"}}, 2.0))
    assert t.error == "out of KV cache" and t.bad_events == 1 and t.output_tokens == 1
    t2 = StreamTally()
    t2.add(ev({"error": "plain"}))
    assert t2.error == "plain"


def test_a_null_usage_and_llama_cpp_timings() -> None:
    t = StreamTally()
    t.add(ev(chat("a", usage=None), 1.0))
    t.add(ev({"choices": [], "timings": {"prompt_ms": 12.5, "predicted_n": 3, "note": "x"}}, 2.0))
    assert t.completion_tokens is None and t.output_tokens == 1
    assert t.timings == {"timings.prompt_ms": 12.5, "timings.predicted_n": 3.0}


def test_server_timing_header_values_are_milliseconds_by_name() -> None:
    value = 'queue;dur=1.5, infer;desc="onnx";dur=3, cache;desc=hit, bad;dur=x'
    assert parse_server_timing(value) == {"queue": 1.5, "infer": 3.0}


def test_milliserves_server_timing_and_the_usage_details() -> None:
    t = StreamTally()
    usage = {
        "prompt_tokens": 31,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 16},
        "completion_tokens_details": {"accepted_prediction_tokens": 3, "rejected_prediction_tokens": 1},
    }
    t.add(ev({"choices": [], "usage": usage, "server_timing": "queue;dur=0.634, ttft;dur=118.5"}))
    assert t.timings == {
        "usage.cached_tokens": 16.0,
        "usage.accepted_prediction_tokens": 3.0,
        "usage.rejected_prediction_tokens": 1.0,
        "server-timing.queue": 0.634,
        "server-timing.ttft": 118.5,
    }
