"""Load measurement for the scenarios: drive loopback servers with wrk, read their CPU time and the machine's, take
medians, print the table, write the results (the servers themselves start through harness.processes).

Every load run is bounded in time and connections and targets 127.0.0.1 only. Results are medians of repeats,
compared as ratios within one run, because this machine is shared and noisy.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def ensure_wrk() -> str:
    path = shutil.which("wrk")
    if path is None:
        subprocess.run(["bash", str(ROOT / "scripts" / "install-system.sh")], check=True)
        path = shutil.which("wrk")
    if path is None:
        raise SystemExit("wrk is not available and could not be installed from Debian packages")
    return path


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of the processes and their children (workers), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        for p in [pid, *_children(pid)]:
            try:
                fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _children(pid: int) -> list[int]:
    try:
        out = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    kids = [int(c) for c in out]
    return kids + [g for k in kids for g in _children(k)]


@dataclass(frozen=True, slots=True)
class LoadResult:
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_req: float
    requests: int
    errors: int
    wrk_cpu_us_per_req: float = 0.0  # the load generator's own CPU (utime+stime) per request
    busy_cores: float = (
        0.0  # the whole machine's busy CPUs during the run (/proc/stat; other users' jobs too)
    )


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
UNIQUE = b"__UNIQUE__"  # in a request body: replaced by a per-request value


def _latency(text: str, pct: str) -> float:
    match = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    return float(match.group(1)) * _UNITS[match.group(2)] if match else float("nan")


def _wrk_script(body: bytes | None, headers: Mapping[str, str], ingress: bool = False) -> str:
    """The wrk Lua script for these request bytes (a fresh body per request where `body` holds UNIQUE; with
    `ingress`, a unique `X-Request-Id` and `traceparent` on every request, as an ingress, load balancer or CDN adds)."""
    script = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)  # noqa: SIM115 - wrk reads it by name
    lines = [f'wrk.method = "{"POST" if body is not None else "GET"}"']
    if body is not None:
        lines.append(f"wrk.body = {json.dumps(body.decode())}")
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    if body is not None and UNIQUE in body:  # a fresh body per request: every request is a real miss
        lines += [
            "counter = 0",
            "seed = tostring(math.random(1, 1000000000))",
            "request = function()",
            "  counter = counter + 1",
            f'  local b = string.gsub(wrk.body, "{UNIQUE.decode()}", seed .. "-" .. counter)',
            "  return wrk.format(nil, nil, nil, b)",
            "end",
        ]
    elif ingress:
        lines += [
            "counter = 0",
            "seed = tostring(math.random(1, 1000000000))",
            # Unique per request but cheap to make (wrk shares the machine's cores with the servers measured):
            # a random prefix drawn once, then the request's counter.
            "local trace = string.format('%08x%08x%08x', math.random(0, 2^31), math.random(0, 2^31), math.random(0, 2^31))",
            "local span = string.format('%08x', math.random(0, 2^31))",
            "request = function()",
            "  counter = counter + 1",
            "  local n = string.format('%08x', counter)",
            '  wrk.headers["X-Request-Id"] = seed .. "-" .. counter',
            '  wrk.headers["traceparent"] = "00-" .. trace .. n .. "-" .. span .. n .. "-01"',
            "  return wrk.format()",
            "end",
        ]
    script.write("\n".join(lines) + "\n")
    script.close()
    return script.name


def wrk(
    url: str,
    *,
    body: bytes | None,
    headers: Mapping[str, str],
    duration_s: int,
    connections: int,
    threads: int,
    pids: Sequence[int],
    ingress: bool = False,
) -> LoadResult:
    script = _wrk_script(body, headers, ingress)
    cpu_before, wrk_before, busy_before = cpu_seconds(pids), _children_cpu(), machine_busy()
    out = subprocess.run(
        [
            ensure_wrk(),
            "-t",
            str(threads),
            "-c",
            str(connections),
            "-d",
            f"{duration_s}s",
            "--latency",
            "-s",
            script,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=duration_s + 30,
        check=True,
    ).stdout
    cpu = cpu_seconds(pids) - cpu_before
    wrk_cpu = _children_cpu() - wrk_before
    busy, total_cpu = (a - b for a, b in zip(machine_busy(), busy_before, strict=True))
    os.unlink(script)
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors_match = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = int(errors_match.group(1)) if errors_match else 0
    if socket_errors:
        errors += sum(int(g) for g in socket_errors.groups())
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return LoadResult(
        rps=rps,
        p50_ms=_latency(out, "50"),
        p99_ms=_latency(out, "99"),
        cpu_us_per_req=cpu / max(total, 1) * 1e6,
        requests=total,
        errors=errors,
        wrk_cpu_us_per_req=wrk_cpu / max(total, 1) * 1e6,
        busy_cores=(os.cpu_count() or 1) * busy / total_cpu if total_cpu else 0.0,
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # waited-for children: each wrk run, once it exits
    return usage.ru_utime + usage.ru_stime


def machine_busy() -> tuple[float, float]:
    """(busy, all) CPU-seconds of the whole machine so far, over every CPU, from /proc/stat's first line."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / ticks, sum(fields) / ticks


def median_result(results: Sequence[LoadResult]) -> LoadResult:
    return LoadResult(
        rps=statistics.median(r.rps for r in results),
        p50_ms=statistics.median(r.p50_ms for r in results),
        p99_ms=statistics.median(r.p99_ms for r in results),
        cpu_us_per_req=statistics.median(r.cpu_us_per_req for r in results),
        requests=sum(r.requests for r in results),
        errors=sum(r.errors for r in results),
        wrk_cpu_us_per_req=statistics.median(r.wrk_cpu_us_per_req for r in results),
        busy_cores=statistics.median(r.busy_cores for r in results),
    )


def print_table(title: str, rows: Sequence[tuple[str, LoadResult]], baseline: str) -> None:
    base = dict(rows)[baseline].rps
    print(f"\n{title}")
    print(
        f"{'system':<34} {'rps':>10} {'ratio':>7} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>11} {'errors':>7}"
        f" {'wrk us/req':>10} {'busy CPUs':>9}"
    )
    for name, r in rows:
        print(
            f"{name:<34} {r.rps:>10.0f} {r.rps / base:>6.2f}x {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} "
            f"{r.cpu_us_per_req:>11.1f} {r.errors:>7} {r.wrk_cpu_us_per_req:>10.1f} {r.busy_cores:>9.2f}"
        )


def write_results(name: str, payload: Mapping[str, object]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=lambda o: asdict(o)) + "\n")
    return path


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000
