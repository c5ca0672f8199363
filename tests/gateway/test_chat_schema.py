"""The shared message rules (tokenedge_wire.chat_schema): roles the model knows, content where the template needs it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream
from tokenedge_wire.chat_schema import ROLES, message_problem, messages_problem


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "wizard", "content": "hi"}, "messages[1].role"),
        ({"role": "User", "content": "hi"}, "messages[1].role"),
        ({"content": "hi"}, "messages[1].role"),
        ({"role": "user", "content": None}, "messages[1].content"),
        ({"role": "system", "content": None}, "messages[1].content"),
        ({"role": "tool", "tool_call_id": "c1"}, "messages[1].content"),
        ({"role": "user", "content": 5}, "messages[1].content"),
        ("hi", "messages[1]"),
    ],
)
def test_a_message_the_model_cannot_use_is_named(message: Any, param: str) -> None:
    problem = messages_problem([{"role": "user", "content": "ok"}, message])
    assert problem is not None and problem.param == param


@pytest.mark.parametrize(
    "message",
    [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        *({"role": role, "content": "x"} for role in ROLES),
    ],
)
def test_messages_the_model_can_use_pass(message: dict[str, Any]) -> None:
    assert message_problem(0, message) is None


@pytest.mark.parametrize("stream", [False, True])
async def test_unknown_role_is_a_400_without_an_upstream_call_and_nothing_is_cached(
    make_gateway: GatewayFactory, fake: FakeUpstream, stream: bool
) -> None:
    gw = await make_gateway()
    bad = {**CHAT, "stream": stream, "messages": [{"role": "wizard", "content": "What is 2+2?"}]}
    for _ in range(2):
        resp = await gw.client.post("/v1/chat/completions", json=bad, headers=AUTH_A)
        body = await resp.json()
        assert resp.status == 400 and body["error"]["param"] == "messages[0].role"
        assert "Cache-Status" not in resp.headers
    assert fake.calls["chat"] == 0 and gw.state.cache.l1.entries() == 0
