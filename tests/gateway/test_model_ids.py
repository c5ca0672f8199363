"""Model ids with '/' (vLLM's `org/name`) through the gateway's path rules (gateway/web/paths.py) and relay.

The SDKs send `models.retrieve("org/name")` as `GET /v1/models/org%2Fname`: the id segment may hold an encoded '/',
forwarded as sent, while every traversal spelling stays refused and never reaches the upstream.
"""

from __future__ import annotations

import openai
import pytest
from openai import AsyncOpenAI

from gateway.web.paths import check_path
from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway
from harness.services import serving
from tests.gateway.test_relay import exchange, request_bytes
from tests.support.fake_upstream import FakeUpstream
from tests.support.token_backend import EchoEngine, backend_app, chatml_byte_tokenizer

ID_PATHS = [
    "/v1/models/org%2Fname",
    "/v1/models/org%2fname",
    "/v1/models/HuggingFaceTB%2FSmolLM2-135M-Instruct",
    "/v1/models/a%2Fb%2Fc",
    "/v1/files/org%2Ffile-1/content",
    "/v1/chat/completions/org%2Fcmpl-1",
]


@pytest.mark.parametrize("path", ID_PATHS)
def test_an_encoded_slash_inside_an_id_segment_passes(path: str) -> None:
    assert check_path(path) is None


STILL_REFUSED = [
    ("/v1/models/%2F..%2F", False),  # resolves to /v1/: refused, though it stays inside
    ("/v1/models/org%2F..%2F..%2Fadmin", False),
    ("/v1/models/..%2F..%2F..%2Fadmin", True),
    ("/v1/models/..%2Fadmin", False),
    ("/v1/models/%2e%2e%2Fx", False),
    ("/v1/models/org%2F.", False),
    ("/v1/models/%2Fname", False),
    ("/v1/models/org%2F", False),
    ("/v1/models/org%2F%2Fname", False),
    ("/v1/models/org%252Fname", False),
    ("/v1/models/org%5Cname", False),
    ("/v1/models/org%2F..%5C..%5C..%5Cadmin", True),
    ("/v1/models/org%2Fa%3Bb", False),
    ("/v1/models/org%2Fa%00", False),
    ("/v1/a%2Fb", False),  # not an id segment
    ("/v1/models%2Forg", False),  # the collection itself is not an id
    ("/v1/models/org%2Fname/extra%2Fmore", False),  # only the id segment
]


@pytest.mark.parametrize(("path", "escapes"), STILL_REFUSED)
def test_traversal_through_an_id_segment_is_still_refused(path: str, escapes: bool) -> None:
    refusal = check_path(path)
    assert refusal is not None
    assert refusal.escapes_v1 is escapes


async def test_the_openai_client_retrieves_an_org_name_model(gw: RunningGateway, fake: FakeUpstream) -> None:
    async with AsyncOpenAI(base_url=gw.url + "/v1", api_key="tenant-a-key", max_retries=0) as client:
        model = await client.models.retrieve("HuggingFaceTB/SmolLM2-135M-Instruct")

    assert model.id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert fake.paths == ["/v1/models/HuggingFaceTB%2FSmolLM2-135M-Instruct"]  # forwarded as sent


@pytest.mark.parametrize("target", ["/v1/models/%2F..%2F", "/v1/models/org%2F..%2F..%2F..%2Fadmin"])
async def test_a_dot_part_in_an_id_is_refused_before_the_upstream(
    gw: RunningGateway, fake: FakeUpstream, target: str
) -> None:
    port = gw.server.port
    assert port is not None
    [answer] = await exchange(port, request_bytes("GET", target))

    assert answer.status == 400 and answer.json()["error"]["code"] == "invalid_path"
    assert fake.calls["model"] == 0


async def test_the_real_backend_serves_its_org_name_model_through_the_gateway(clock: FakeClock) -> None:
    """The co-deployed backend's `/v1/models/{model:.+}` reads the id the gateway forwards as sent."""
    tokenizer = chatml_byte_tokenizer()
    model_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    app = backend_app(tokenizer, EchoEngine(tokenizer), model_id=model_id)
    async with serving(app) as url:
        gw = await start_gateway(gateway_config(url), clock)
        try:
            async with AsyncOpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0) as client:
                model = await client.models.retrieve(model_id)
                with pytest.raises(openai.NotFoundError):
                    await client.models.retrieve("HuggingFaceTB/other")
        finally:
            await gw.close()

    assert model.id == model_id and model.owned_by == "tokenedge"


async def test_an_upstream_without_retrieve_gets_the_listed_object(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    """llama-server lists its models but answers 404 to `/v1/models/{id}`: the gateway answers from the list."""
    fake.retrieve = False
    async with AsyncOpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0) as client:
        model = await client.models.retrieve("test-model")
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("org/unlisted")

    assert model.id == "test-model" and model.owned_by == "tokenedge"
    assert fake.calls["model"] == 2  # the upstream was asked first, both times
    assert fake.paths == ["/v1/models/test-model", "/v1/models/org%2Funlisted"]
