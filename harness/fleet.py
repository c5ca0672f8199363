"""The pure parts of `bench fleet` (issue 37): its two workloads and their drivers, the ideal prefix reuse of each,
the engines' reuse read from their `/metrics` text, and the closing summary table. No engine, no network here:
the drivers call an `ask` the bench gives them, so the unit tests drive them with a fake one.

Workloads:
- `shared_prefix`: a scaled-down SGLang "generated-shared-prefix": groups x questions, one ~550-token system prompt
  per group, every question unique, shuffled with a seeded RNG (`shared_prefix`, run by `run_queue`);
- `multi_turn`: a scaled-down vLLM production-stack multi-round QA: each user has its own ~300-token document as
  its system prompt and asks rounds of unique questions, each round sending the whole history and appending the
  answer it got; users run as concurrent loops, at most `concurrency` requests in flight (`run_users`).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

Messages = list[dict[str, str]]
Row = dict[str, Any]
Ask = Callable[[Messages], Awaitable[Row]]  # one request -> its row (prompt, completion, answer, ...)
WORKLOADS = ("shared_prefix", "multi_turn")
BASELINES = ("client_rr", "least_loaded")  # the cost arm is compared with the better of these

# (metric of cached prompt tokens, metric of prompt tokens computed), per engine, as each names them in /metrics
REUSE_METRICS = (
    ("llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_tokens_total"),
    ("tokenedge_backend_prefix_cache_hit_tokens_total", "tokenedge_backend_prefill_tokens_total"),
)
# requests an engine answered, where its /metrics counts them (our backend's first-token histogram, every transport)
REQUEST_METRICS = ("tokenedge_backend_ttft_seconds_count",)


def shared_prefix(groups: int, questions: int, run: int) -> list[Messages]:
    """Requests in arrival order, shuffled with a seeded RNG as SGLang's bench does (seed 0: every arm gets the
    same order; in a fixed interleaving, client round-robin over an even number of groups would be affine)."""
    out = []
    for q in range(questions):
        for g in range(groups):
            system = " ".join(
                f"Rule {g}.{i}: answer group {g} questions about topic {i} briefly." for i in range(30)
            )
            question = f"Run {run}, question {q} for group {g}: which colour comes first?"
            out.append([{"role": "system", "content": system}, {"role": "user", "content": question}])
    random.Random(0).shuffle(out)
    return out


def shared_prefix_ideal(questions: int) -> float:
    """Of each group's system prompt, the share a perfect router reuses: all but its group's first request."""
    return (questions - 1) / questions if questions else 0.0


def user_document(user: int) -> str:
    """User `user`'s own system prompt, ~300 tokens, sharing no sentence with another user's."""
    return " ".join(
        f"Note {user}.{i}: customer {user} filed item {i * 7 + user} under subject {i} in folder {user}."
        for i in range(12)
    )


def user_question(user: int, round_: int, run: int) -> str:
    """Unique per run, user and round: the gateway's response cache never answers it."""
    return f"Run {run}, user {user}, round {round_}: what does note {user}.{(round_ * 5) % 12} say, in short?"


async def run_queue(requests: Sequence[Messages], ask: Ask, concurrency: int) -> list[Row]:
    """Requests in order, `concurrency` at a time (each worker takes the next as it finishes one)."""
    queue = list(requests)
    rows: list[Row] = []

    async def worker() -> None:
        while queue:
            rows.append(await ask(queue.pop(0)))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return rows


async def run_users(ask: Ask, users: int, rounds: int, concurrency: int, run: int) -> list[Row]:
    """Every user a loop of `rounds` rounds, all loops at once but at most `concurrency` requests in flight (the
    semaphore serves waiters in order, so the users interleave). A round sends the whole history plus a new
    question and appends the answer it got; its row gains `user` and `round`."""
    gate = asyncio.Semaphore(concurrency)
    rows: list[Row] = []

    async def user_loop(user: int) -> None:
        history: Messages = [{"role": "system", "content": user_document(user)}]
        for round_ in range(rounds):
            history.append({"role": "user", "content": user_question(user, round_, run)})
            async with gate:
                row = await ask(list(history))
            rows.append({**row, "user": user, "round": round_})
            history.append({"role": "assistant", "content": row.get("answer", "")})

    await asyncio.gather(*(user_loop(u) for u in range(users)))
    return rows


def multi_turn_ideal(rows: Sequence[Row]) -> float:
    """The prefix reuse a perfect router would get, from the rows: each request may reuse its user's previous
    request's prompt plus the tokens answered to it (at most its own prompt), over all prompt tokens. An upper
    bound: the answer's text is tokenized again in the next prompt, and an engine caches whole blocks."""
    by_user: dict[Any, list[Row]] = defaultdict(list)
    for row in rows:
        by_user[row["user"]].append(row)
    reusable = 0
    for turns in by_user.values():
        turns.sort(key=lambda r: r["round"])
        for before, row in itertools.pairwise(turns):
            reusable += min(row["prompt"], before["prompt"] + before["completion"])
    return reusable / max(1, sum(r["prompt"] for r in rows))


def reuse_from_metrics(texts: Sequence[str]) -> float | None:
    """Cached over all prompt tokens, from the engines' `/metrics` texts (llama-server's or our backend's
    counters); None when no text has either pair."""
    cached = computed = 0.0
    found = False
    for text in texts:
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            for cached_name, computed_name in REUSE_METRICS:
                if name == cached_name:
                    cached += float(value)
                    found = True
                elif name == computed_name:
                    computed += float(value)
                    found = True
    return cached / max(1.0, cached + computed) if found else None


def requests_from_metrics(text: str) -> int | None:
    """The requests an engine answered, from its `/metrics` text; None when it does not count them."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in REQUEST_METRICS:
            return int(float(value))
    return None


MEASURES = (
    "reuse",
    "engine_reuse",
    "ideal",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_mean_ms",
    "wall_s",
    "pile_up",
)


def medians(rows: Sequence[Row]) -> dict[tuple[str, str], dict[str, Row]]:
    """(workload, engine) -> arm -> the median over its repeats of every measure (None where a repeat has none),
    arms in the order they first ran."""
    grouped: dict[tuple[str, str], dict[str, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        grouped[(row["workload"], row["engine"])][row["arm"]].append(row)
    out: dict[tuple[str, str], dict[str, Row]] = {}
    for key, arms in grouped.items():
        out[key] = {}
        for arm, repeats in arms.items():
            med: Row = {"repeats": len(repeats)}
            for name in MEASURES:
                values = [r[name] for r in repeats if r.get(name) is not None]
                med[name] = statistics.median(values) if len(values) == len(repeats) else None
            out[key][arm] = med
    return out


def cost_ratios(arms: dict[str, Row]) -> dict[str, tuple[float, float]]:
    """Each `cost` arm (`cost`, `cost@2w`, ...) -> (mean TTFT, wall) over the better (lower) of the baselines'."""
    present = [arms[b] for b in BASELINES if b in arms]
    if not present:
        return {}
    best_ttft = min(r["ttft_mean_ms"] for r in present)
    best_wall = min(r["wall_s"] for r in present)
    return {
        arm: (row["ttft_mean_ms"] / best_ttft, row["wall_s"] / best_wall)
        for arm, row in arms.items()
        if arm.partition("@")[0] == "cost"
    }


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_lines(rows: Sequence[Row]) -> list[str]:
    """The closing table: per (workload, engine), per arm the medians of its repeats, then the cost arms' ratios."""
    lines = []
    for (workload, engine), arms in medians(rows).items():
        lines.append(f"\n{workload} on {engine} (median of repeats)")
        lines.append(
            f"{'arm':>13} {'reuse':>6} {'engines':>7} {'ideal':>6} {'p50 ms':>7} {'p90 ms':>7} {'mean ms':>8}"
            f" {'wall s':>7} {'pile-up':>7} {'n':>2}"
        )
        for arm, m in arms.items():
            lines.append(
                f"{arm:>13} {_cell(m['reuse'], '.3f'):>6} {_cell(m['engine_reuse'], '.3f'):>7}"
                f" {_cell(m['ideal'], '.3f'):>6} {_cell(m['ttft_p50_ms'], '.0f'):>7}"
                f" {_cell(m['ttft_p90_ms'], '.0f'):>7} {_cell(m['ttft_mean_ms'], '.0f'):>8}"
                f" {_cell(m['wall_s'], '.1f'):>7} {_cell(m['pile_up'], '.0%'):>7} {m['repeats']:>2}"
            )
        for arm, (ttft, wall) in cost_ratios(arms).items():
            lines.append(
                f"{arm:>13} / better of {' and '.join(BASELINES)}: mean TTFT {ttft:.2f}x, wall {wall:.2f}x"
            )
    return lines
