"""The binary transport client (gateway.tokens.transport) and its frame reader: upstream faults become UpstreamErrors."""

from __future__ import annotations

import json
import struct
from array import array
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tokens.render import Rendering
from gateway.tokens.transport import BinaryCall
from gateway.upstream.http import Upstream
from gateway.web.errors import UpstreamError, UpstreamTimeout
from tokenedge_wire.framing import FrameReader, WireError, frame

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class _Body:
    def __init__(self, status: int, body: bytes | BaseException) -> None:
        self.status, self.headers, self._body = status, {}, body

    async def read(self) -> bytes:
        if isinstance(self._body, BaseException):
            raise self._body
        return self._body


class _Upstream:
    """Answers every `open` with one canned response (or a read failure)."""

    def __init__(self, status: int, body: bytes | BaseException) -> None:
        self._resp = _Body(status, body)

    @asynccontextmanager
    async def open_stream(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> AsyncIterator[Any]:
        yield self._resp

    request = Upstream.request  # the real read-and-translate, over this `open`


def _call(upstream: _Upstream) -> BinaryCall:
    return BinaryCall(upstream, "chat/completions", CHAT, array("i", [1, 2]), "tok-v")  # type: ignore[arg-type]


def test_a_frame_that_is_not_json_is_a_wire_error() -> None:
    with pytest.raises(WireError):
        list(FrameReader().feed(struct.pack("<I", 3) + b"{no"))


def test_whole_frames_are_returned_and_a_partial_one_waits() -> None:
    reader = FrameReader()
    data = frame({"meta": {"id": "x"}}) + frame({"usage": {}})
    assert list(reader.feed(data[:-2])) == [{"meta": {"id": "x"}}]
    assert list(reader.feed(data[-2:])) == [{"usage": {}}]


async def test_a_read_timeout_is_an_upstream_timeout() -> None:
    with pytest.raises(UpstreamTimeout):
        await _call(_Upstream(200, TimeoutError())).request({})


async def test_a_garbled_event_body_is_an_upstream_error() -> None:
    with pytest.raises(UpstreamError):
        await _call(_Upstream(200, struct.pack("<I", 3) + b"{no")).request({})


@pytest.mark.parametrize(
    "event",
    [
        {"t": "x", "f": None},
        {"i": 7, "t": "x", "f": None},
        {"i": 0, "t": 5, "f": None},
        {"i": "0", "t": "x", "f": None},
        {"i": 0, "t": "x", "f": 3},
    ],
)
async def test_a_malformed_text_event_is_an_upstream_error_not_a_500(event: dict[str, Any]) -> None:
    body = frame({"meta": {"id": "x"}}) + frame(event) + frame({"usage": {}})
    with pytest.raises(UpstreamError, match="malformed text event"):
        await _call(_Upstream(200, body)).request({})


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(meta=st.dictionaries(st.text(max_size=8), _json_values, max_size=5), text=st.text())
def test_rendered_frames_are_the_json_paths_bytes_whatever_the_meta_holds(
    meta: dict[str, Any], text: str
) -> None:
    """The backend's JSON path writes `json.dumps(ensure_ascii=False, separators=(",", ":"))`; the render takes
    orjson where that is the same bytes (`plain_json`). Mutation (`plain_json` always True): a float or a huge
    integer in the meta is spelled otherwise (`1e-05` / `1e-5`), or refused."""
    render = Rendering("chat", 1, include_usage=True)
    render.set_meta(meta)
    got = b"".join(render.stream_event({"i": 0, "t": text, "f": None}))
    payload = {
        **meta,
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}],
        "usage": None,
    }
    if text:
        assert got == f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()
