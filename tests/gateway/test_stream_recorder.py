"""Pure pieces of gateway.misses.streaming: the SSE parser, the recorder's assembly and store facts, and replay."""

from __future__ import annotations

import orjson
import pytest

from gateway.keys.entry import Entry
from gateway.misses.streaming.recorder import Kind, Recorder
from gateway.misses.streaming.replay import replay_frames
from gateway.misses.streaming.sse import Event, SSEParser, data_frame


@pytest.mark.parametrize(
    "pieces",
    [
        [b"data: a\n\ndata: b\n\n"],
        [b"data: a\n", b"\ndata: b\n\n"],
        [b"data: a\r", b"\n\r\ndata: b\r\n\r\n"],
        [b": keep-alive\n\ndata:a\n\n", b"data: b\n", b"\n"],
    ],
)
def test_parser_yields_each_event_once_whatever_the_split(pieces: list[bytes]) -> None:
    parser = SSEParser()
    events = [e for piece in pieces for e in parser.feed(piece)] + parser.close()
    assert events == [Event(b"a"), Event(b"b")]


def test_parser_joins_data_lines_and_keeps_the_event_name() -> None:
    events = SSEParser().feed(b"event: error\ndata: {\ndata: }\nid: 7\n\n")
    assert events == [Event(b"{\n}", "error")]
    assert data_frame(b"{\n}", "error") == b"event: error\ndata: {\ndata: }\n\n"


def chunk(delta: dict | None = None, finish: str | None = None, **top: object) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return orjson.dumps(
        {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices, **top}
    )


def record(*payloads: bytes, max_bytes: int = 1 << 20) -> Recorder:
    rec = Recorder("chat/completions", max_bytes)
    for p in payloads:
        rec.feed(p)
    return rec


def test_recorder_assembles_content_tool_calls_and_usage() -> None:
    rec = record(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hi"}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "t1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"a"'},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        chunk({}, "tool_calls"),
        chunk(None, usage={"total_tokens": 3}),
        b"[DONE]",
    )
    body = orjson.loads(rec.body())
    assert rec.complete and len(rec.chunks) == 6
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Hi",
        "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
    }
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["usage"] == {"total_tokens": 3}


@pytest.mark.parametrize(
    ("payloads", "complete"),
    [
        ([chunk({"content": "x"}, "stop"), b"[DONE]"], True),
        ([chunk({"content": "x"}, "stop")], False),  # no [DONE]
        ([chunk({"content": "x"}), b"[DONE]"], False),  # a choice never finished
        ([chunk({"content": "x"}, "stop"), b'{"error": {"message": "boom"}}', b"[DONE]"], False),
        ([chunk({"content": "x"}, "stop"), b"not json", b"[DONE]"], False),
    ],
)
def test_recorder_completeness(payloads: list[bytes], complete: bool) -> None:
    assert record(*payloads).complete is complete


def test_recorder_drops_everything_past_the_cap() -> None:
    rec = record(chunk({"content": "x" * 200}), chunk({}, "stop"), b"[DONE]", max_bytes=100)
    assert rec.too_large and not rec.complete and rec.chunks == []


def test_recorder_classifies_events() -> None:
    rec = Recorder("chat/completions", 1 << 20)
    assert rec.feed(chunk({"content": "x"})) is Kind.CHUNK
    assert rec.feed(chunk(None, usage={"total_tokens": 1})) is Kind.USAGE
    assert rec.feed(b'{"error": {"message": "e"}}') is Kind.ERROR
    assert rec.feed(b"[DONE]") is Kind.DONE


def entry(
    body: dict,
    chunks: tuple[bytes, ...] | None = None,
    usage: dict | None = None,
    endpoint: str = "chat/completions",
) -> Entry:
    return Entry(
        key="te1:t:d",
        endpoint=endpoint,
        body=orjson.dumps(body),
        model="m",
        revision="r",
        created_at=0.0,
        ttl_s=60,
        stale_if_error_s=0,
        etag='"e"',
        tags=(),
        usage=usage,
        stream_chunks=chunks,
    )


def payloads(frames: list[bytes]) -> list[dict | str]:
    out: list[dict | str] = []
    for frame in frames:
        data = frame.removeprefix(b"data: ").rstrip(b"\n")
        out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


COMPLETION = {
    "id": "c9",
    "object": "chat.completion",
    "created": 5,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "abcdef"}, "finish_reason": "stop"}],
    "usage": {"total_tokens": 9},
}


@pytest.mark.parametrize(("chunk_chars", "pieces"), [(0, ["abcdef"]), (4, ["abcd", "ef"]), (100, ["abcdef"])])
def test_json_entry_replays_as_chunks(chunk_chars: int, pieces: list[str]) -> None:
    out = payloads(replay_frames(entry(COMPLETION), include_usage=False, chunk_chars=chunk_chars))
    assert out[-1] == "[DONE]"
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"]["content"] for c in out[1:-2]] == pieces
    assert out[-2]["choices"][0]["finish_reason"] == "stop"
    assert {c["object"] for c in out[:-1]} == {"chat.completion.chunk"}


def test_recorded_usage_chunk_follows_the_new_request() -> None:
    chunks = (chunk({"content": "x"}, "stop"), chunk(None, usage={"total_tokens": 2}))
    without = payloads(replay_frames(entry(COMPLETION, chunks), include_usage=False, chunk_chars=0))
    with_usage = payloads(replay_frames(entry(COMPLETION, chunks), include_usage=True, chunk_chars=0))
    assert len(without) == 2 and len(with_usage) == 3
    synthesized = payloads(
        replay_frames(
            entry(COMPLETION, chunks[:1], usage={"total_tokens": 2}), include_usage=True, chunk_chars=0
        )
    )
    assert synthesized[1] == {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [],
        "usage": {"total_tokens": 2},
    }


def test_text_completion_entry_replays_as_text_completion_events() -> None:
    doc = {
        "id": "t",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": "hey", "logprobs": None, "finish_reason": "length"}],
    }
    out = payloads(replay_frames(entry(doc, endpoint="completions"), include_usage=True, chunk_chars=0))
    assert [c["choices"][0]["text"] for c in out[:-1]] == ["hey", ""]
    assert out[-2]["choices"][0]["finish_reason"] == "length"
    assert {c["object"] for c in out[:-1]} == {"text_completion"}
