"""The shipped edges key tenant entries by every credential part the gateway scopes by: two callers that differ only
in `OpenAI-Organization`, `OpenAI-Project`, `api-key` or `x-api-key` never share an nginx or Varnish entry."""

from __future__ import annotations

import pytest

from tests.cdn.conftest import AUTH_A, EdgeStack, StackFactory, chat

CHAT = "/v1/chat/completions"
PAIRS = [
    ({**AUTH_A, "OpenAI-Organization": "org-1"}, {**AUTH_A, "OpenAI-Organization": "org-2"}),
    ({**AUTH_A, "OpenAI-Project": "proj-1"}, {**AUTH_A, "OpenAI-Project": "proj-2"}),
    ({"api-key": "azure-1"}, {"api-key": "azure-2"}),
    ({"x-api-key": "xk-1"}, {"x-api-key": "xk-2"}),
]


async def check_pairs(stack: EdgeStack, edge: str) -> None:
    for index, (first, second) in enumerate(PAIRS):
        body = chat(f"question {index}")
        await stack.post(CHAT, body, first)
        again, _ = await stack.post(CHAT, body, first)
        other, _ = await stack.post(CHAT, body, second)
        assert f"{edge}; hit" in again.headers["Cache-Status"]  # the edge does cache these callers
        assert f"{edge}; hit" not in other.headers["Cache-Status"], index
        assert "tokenedge; fwd=miss" in other.headers["Cache-Status"], index
    assert stack.fake.calls["chat"] == 2 * len(PAIRS)


@pytest.mark.parametrize("edge", ["nginx"])
async def test_nginx_keys_every_credential_part(make_nginx: StackFactory, edge: str) -> None:
    await check_pairs(await make_nginx(), edge)


@pytest.mark.parametrize("edge", ["varnish"])
async def test_varnish_keys_every_credential_part(make_varnish: StackFactory, edge: str) -> None:
    await check_pairs(await make_varnish(), edge)
