"""Every private aiohttp name in gateway/web/aioseam.py exists and behaves on the installed aiohttp, and the installed
aiohttp is inside the range pyproject.toml declares: an upgrade that moves one fails here, by name."""

from __future__ import annotations

import asyncio
import re
import tomllib
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from aiohttp.web_protocol import RequestHandler
from packaging.requirements import Requirement
from packaging.version import Version

from gateway.web import aioseam

ROOT = Path(__file__).resolve().parents[2]


async def _handler(_request: web.BaseRequest) -> web.StreamResponse:
    return web.Response()


async def instances() -> dict[str, Any]:
    server = web.Server(_handler, loop=asyncio.get_running_loop())
    return {
        "web.BaseRequest": make_mocked_request("POST", "/v1/chat/completions"),
        "web.StreamResponse": web.StreamResponse(),
        "web.Application": web.Application(client_max_size=1234),
        "web.AppRunner": web.AppRunner(web.Application()),
        "web.Server": server,
        "RequestHandler": RequestHandler(server, loop=asyncio.get_running_loop()),
    }


async def test_every_private_name_the_seam_uses_exists() -> None:
    objects = await instances()
    missing = [
        f"{owner}.{name} ({why})" for owner, name, why in aioseam.USES if not hasattr(objects[owner], name)
    ]
    assert missing == [], f"aiohttp {aiohttp.__version__} lacks: {missing}"


async def test_the_seam_module_is_the_only_user_of_private_aiohttp_names() -> None:
    names = {name for _, name, _ in aioseam.USES}
    users = []
    for path in (ROOT / "gateway").rglob("*.py"):
        if path.name == "aioseam.py":
            continue
        text = path.read_text()
        users += [f"{path.relative_to(ROOT)}: {name}" for name in names if re.search(rf"\.{name}\b", text)]
    assert users == []


async def test_a_body_set_through_the_seam_is_what_the_request_reads() -> None:
    request = make_mocked_request("POST", "/v1/chat/completions", headers={"Content-Length": "2"})
    assert aioseam.body_read(request) is None
    assert aioseam.client_max_size(web.Application(client_max_size=1234)) == 1234
    aioseam.set_body(request, b"{}")
    assert await request.read() == b"{}" and aioseam.body_read(request) == b"{}"


async def test_a_response_adopted_through_the_seam_is_prepared_without_headers() -> None:
    request = make_mocked_request("HEAD", "/v1/cache/x")
    response = web.StreamResponse()
    writer = aioseam.adopt_prepared(response, request)
    assert writer is not None and response.prepared and not aioseam.eof_sent(response)
    assert aioseam.adopt_prepared(response, request) is writer  # prepared once
    assert response.keep_alive == request.keep_alive


async def test_the_server_and_protocol_names_carry_what_the_edge_reads() -> None:
    loop = asyncio.get_running_loop()
    server = web.Server(_handler, loop=loop, keepalive_timeout=12.5)
    assert aioseam.server_loop(server) is loop
    assert aioseam.server_kwargs(server) == {"keepalive_timeout": 12.5}
    handler = RequestHandler(server, loop=loop)
    assert aioseam.handler_loop(handler) is loop and aioseam.current_request(handler) is None
    aioseam.no_lingering(handler)
    assert handler._lingering_time == 0.0


def test_the_installed_aiohttp_is_inside_the_declared_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (spec,) = [Requirement(d) for d in project["dependencies"] if Requirement(d).name == "aiohttp"]
    bounds = {s.operator for s in spec.specifier}
    assert "<" in bounds and bounds & {">=", "=="}, f"aiohttp needs a floor and an upper bound: {spec}"
    assert Version(aiohttp.__version__) in spec.specifier
