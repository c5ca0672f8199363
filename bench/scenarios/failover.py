"""`python -m bench failover`: issue 37's failover acceptance on real engines, as
`tests/gateway/test_failover_real.py` runs it (`harness.failover`): two one-slot, one-thread `llama-server`
engines behind one gateway, a steady load of unique misses (JSON and streams alternating, concurrency 2), one
engine SIGKILLed then restarted, then one SIGSTOPped for `--stall-s` (15 s, the acceptance's number) and
continued. `--deadlines fast` (default) uses the test's health checks and first-byte deadline; `--deadlines
shipped` those configs/gateway.toml ships (checks every 2 s bounded by 2 s, three failures eject, a 30 s
first-byte deadline); `--set KEY=VALUE` overrides any `[upstream]` field (e.g. `--set
queue_beside_idle_share=0`). Prints one row per fault and the run's totals.
"""

from __future__ import annotations

import argparse
import asyncio
import tomllib
from typing import Any

from backend.loader import default_model_path
from harness.failover import (
    FAST_DEADLINES,
    Engine,
    Plan,
    Report,
    fleet,
    scenario,
    shipped_deadlines,
    upstream_section,
)
from harness.gateway import FakeClock, gateway_config, start_gateway
from harness.peers.llamacpp_build import ensure_build


async def run(engines: list[Engine], plan: Plan, deadlines: dict[str, Any]) -> Report:
    config = gateway_config(engines[0].url, upstream=upstream_section(engines, deadlines))
    gw = await start_gateway(config, FakeClock())
    try:
        return await scenario(gw, engines, plan)
    finally:
        await gw.close()


def print_report(report: Report, deadlines: dict[str, Any]) -> None:
    summary = report.summary()
    print(f"deadlines: {deadlines}")
    print(
        "| fault | queued on victim | ejected after (s) | worst JSON answer while out (s) "
        "| healthy engine answers/s (normal) | readmitted after (s) "
        "| restored engine's share after (first 10) | long stream |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in ("kill", "stall"):
        f = summary[name]
        cells = [
            name,
            f["queued_on_victim"],
            f["ejected_s"],
            f["worst_json_s"],
            f"{f['healthy_rate']} ({f['healthy_normal_rate']})",
            f["readmitted_s"],
            f"{f['restored_after']} ({f['restored_first_10']})",
            f["long_stream"],
        ]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    totals = {k: v for k, v in summary.items() if k not in ("kill", "stall")}
    print(totals)


def override(item: str) -> tuple[str, Any]:
    """`KEY=VALUE` with VALUE read as TOML (0.25, 3, true, "x")."""
    key, _, value = item.partition("=")
    return key, tomllib.loads(f"v = {value}")["v"]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench failover")
    parser.add_argument("--stall-s", type=float, default=15.0, help="how long the SIGSTOP lasts")
    parser.add_argument("--deadlines", choices=("fast", "shipped"), default="fast")
    parser.add_argument("--after-n", type=int, default=30, help="requests counted after each recovery")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an [upstream] field")
    args = parser.parse_args(argv)
    deadlines = FAST_DEADLINES if args.deadlines == "fast" else shipped_deadlines()
    deadlines = {**deadlines, **dict(override(item) for item in args.set)}
    plan = Plan(stall_s=args.stall_s, after_n=args.after_n, wait_s=120.0)
    with fleet(ensure_build(), default_model_path()) as engines:
        report = asyncio.run(run(engines, plan, deadlines))
    print_report(report, deadlines)
