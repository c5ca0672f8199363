"""The documented response-header table (docs/request-flow.md) is the CDN contract: its streamed-miss column matches a real streamed miss
(on a tenant route, so "the credential headers" is the tenancy's credential header list)."""

from __future__ import annotations

import re
from pathlib import Path

from harness.gateway import RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT

README = Path(__file__).resolve().parents[2] / "docs" / "request-flow.md"


def header_table() -> tuple[list[str], dict[str, list[str]]]:
    """(column titles, {header name: cells}) of the table under "## Response headers"."""
    section = README.read_text().split("## Response headers", 1)[1].split("\n", 1)[1].lstrip("\n")
    lines = section.split("\n\n", 1)[0].splitlines()  # the first table: contiguous `|` lines
    split = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]
    columns, rows = split[0], split[2:]
    table: dict[str, list[str]] = {}
    for row in rows:
        for name in re.findall(r"`([A-Za-z-]+)`", row[0]):
            table[name] = row[1:]
    return columns[1:], table


async def test_the_streamed_miss_column_matches_a_streamed_miss(gw: RunningGateway) -> None:
    columns, table = header_table()
    column = columns.index("streamed miss")
    resp = await gw.client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH_A)
    await resp.read()
    assert resp.status == 200
    assert {
        "Cache-Status",
        "Cache-Control",
        "CDN-Cache-Control",
        "Age",
        "ETag",
        "X-Cache-Key",
        "Vary",
    } <= table.keys()
    for name, cells in table.items():
        cell, actual = cells[column], resp.headers.get(name)
        if cell == "-":
            assert actual is None, (name, actual)
        elif cell == "the key":
            assert actual is not None and actual.startswith("te1:"), name
        elif cell.startswith("the credential headers"):
            assert gw.state.tenancy is not None
            assert actual == ", ".join(gw.state.tenancy.credential_headers), name
        else:
            documented = re.match(r"`([^`]*)`", cell)
            assert documented is not None, f"README: streamed-miss cell for {name} is not a literal: {cell!r}"
            assert actual == documented.group(1), (name, actual, cell)
