"""The pure parts of `bench fleet` (harness/fleet.py): its workloads and drivers, the ideal reuse of multi_turn,
the engines' reuse read from both engines' `/metrics`, and the closing summary table."""

from __future__ import annotations

import asyncio
import random

import pytest

from backend.engine.outputs import EngineStats
from backend.metrics import BackendMetrics
from harness.fleet import (
    Messages,
    Row,
    cost_ratios,
    medians,
    multi_turn_ideal,
    requests_from_metrics,
    reuse_from_metrics,
    run_queue,
    run_users,
    shared_prefix,
    shared_prefix_ideal,
    summary_lines,
    user_document,
)


class FakeEngine:
    """An `ask` that records what it was sent and how many requests it held at once; each request yields to the
    event loop a few times before it answers, so requests in flight overlap."""

    def __init__(self) -> None:
        self.sent: list[Messages] = []
        self.held = self.most_held = 0

    async def ask(self, messages: Messages) -> Row:
        self.sent.append(messages)
        n = len(self.sent)
        self.held += 1
        self.most_held = max(self.most_held, self.held)
        for _ in range(3):
            await asyncio.sleep(0)  # a yield to the other tasks, not a wait for time
        self.held -= 1
        return {"prompt": 10 * n, "completion": 8, "answer": f"answer {n}"}


def test_shared_prefix_groups_share_a_system_prompt_and_every_question_is_unique() -> None:
    requests = shared_prefix(3, 4, run=7)
    assert len(requests) == 12
    systems = {r[0]["content"] for r in requests}
    assert len(systems) == 3 and all(len(s) > 1000 for s in systems)
    assert len({r[1]["content"] for r in requests}) == 12
    assert all("Run 7," in r[1]["content"] for r in requests)
    # the same seeded order for every arm: only the run's number differs between runs
    again = shared_prefix(3, 4, run=8)
    assert [r[0] for r in again] == [r[0] for r in requests]
    assert [r[1]["content"].replace("Run 8,", "Run 7,") for r in again] == [r[1]["content"] for r in requests]
    assert shared_prefix_ideal(6) == pytest.approx(5 / 6)


def test_run_queue_sends_every_request_in_order_at_the_concurrency() -> None:
    fake = FakeEngine()
    requests = shared_prefix(2, 5, run=0)
    rows = asyncio.run(run_queue(requests, fake.ask, 3))
    assert len(rows) == 10 and fake.sent == requests
    assert fake.most_held == 3


def test_every_user_sends_its_whole_history_and_appends_the_answer_it_got() -> None:
    fake = FakeEngine()
    rows = asyncio.run(run_users(fake.ask, users=3, rounds=4, concurrency=2, run=1))
    assert len(rows) == 12 and fake.most_held == 2
    assert sorted((r["user"], r["round"]) for r in rows) == [(u, k) for u in range(3) for k in range(4)]
    for row in rows:
        # the row's own request: the sent list is in the order the requests were made
        sent = fake.sent[int(row["answer"].split()[1]) - 1]
        assert len(sent) == 2 + 2 * row["round"]
        assert sent[0] == {"role": "system", "content": user_document(row["user"])}
        assert [m["role"] for m in sent[1:]] == ["user", "assistant"] * row["round"] + ["user"]
        earlier = sorted((r for r in rows if r["user"] == row["user"] and r["round"] < row["round"]),
                         key=lambda r: r["round"])  # fmt: skip
        assert [m["content"] for m in sent[2::2]] == [r["answer"] for r in earlier]
    questions = [m["content"] for s in fake.sent for m in s if m["role"] == "user"]
    assert len(set(questions)) == 12 and all("Run 1," in q for q in questions)
    # interleaved: every user's first round goes before any user's second
    assert [r["round"] for r in rows[:3]] == [0, 0, 0]
    assert len({user_document(u) for u in range(6)}) == 6 and all(
        len(user_document(u)) > 600 for u in range(6)
    )


def test_the_multi_turn_ideal_is_the_previous_prompt_and_answer_over_all_prompt_tokens() -> None:
    rows = [
        {"user": 0, "round": 0, "prompt": 100, "completion": 8},
        {"user": 0, "round": 1, "prompt": 120, "completion": 8},
        {"user": 0, "round": 2, "prompt": 140, "completion": 8},
        {"user": 1, "round": 0, "prompt": 50, "completion": 8},
        {"user": 1, "round": 1, "prompt": 55, "completion": 8},  # capped: 50 + 8 > 55
    ]
    expected = (108 + 128 + 55) / (100 + 120 + 140 + 50 + 55)
    assert multi_turn_ideal(rows) == pytest.approx(expected)
    shuffled = list(rows)
    random.Random(3).shuffle(shuffled)
    assert multi_turn_ideal(shuffled) == pytest.approx(expected)
    assert multi_turn_ideal([]) == 0.0


def _our_metrics(hits: int, computed: int, answered: int = 0) -> str:
    stats = EngineStats(
        running=0,
        waiting=0,
        blocks_total=8,
        blocks_free=8,
        blocks_cached=0,
        prefix_hit_tokens_total=hits,
        prefill_tokens_total=computed,
        generated_tokens_total=99,
    )
    metrics = BackendMetrics(lambda: stats)
    for _ in range(answered):
        metrics.ttft_seconds.observe(0.2)
    return metrics.render().decode()


def test_reuse_is_read_from_either_engines_metrics() -> None:
    llama = "# HELP llamacpp:prompt_tokens_total x\nllamacpp:prompt_tokens_total 300\nllamacpp:prompt_tokens_cached_total 100\n"
    assert reuse_from_metrics([llama, llama]) == pytest.approx(0.25)
    # our backend's own exposition, rendered by its metrics class: the names the bench reads are the served ones
    ours = [_our_metrics(30, 70), _our_metrics(10, 90)]
    assert "\ntokenedge_backend_prefix_cache_hit_tokens_total 30.0\n" in ours[0]
    assert reuse_from_metrics(ours) == pytest.approx(40 / 200)
    assert reuse_from_metrics(["# nothing here\nother_total 5\n"]) is None
    # requests per engine, where the gateway's answer does not name the engine: our backend counts them
    assert requests_from_metrics(_our_metrics(1, 2, answered=3)) == 3
    assert requests_from_metrics(ours[0]) == 0 and requests_from_metrics(llama) is None


def _arm(workload: str, arm: str, ttft: float, wall: float, reuse: float, engine_reuse: float | None) -> Row:
    return {
        "workload": workload,
        "engine": "ours",
        "arm": arm,
        "reuse": reuse,
        "engine_reuse": engine_reuse,
        "ideal": 0.8,
        "ttft_p50_ms": ttft - 5,
        "ttft_p90_ms": ttft + 5,
        "ttft_mean_ms": ttft,
        "wall_s": wall,
        "pile_up": 0.1,
    }


def test_the_summary_takes_medians_per_arm_and_the_cost_ratios_to_the_better_baseline() -> None:
    rows = [
        _arm("multi_turn", "client_rr", 200, 10, 0.2, 0.2),
        _arm("multi_turn", "least_loaded", 150, 12, 0.3, 0.3),
        _arm("multi_turn", "cost", 120, 9, 0.7, None),
        _arm("multi_turn", "client_rr", 220, 11, 0.4, 0.3),
        _arm("multi_turn", "least_loaded", 170, 8, 0.5, 0.4),
        _arm("multi_turn", "cost", 100, 7, 0.6, 0.6),
        _arm("shared_prefix", "cost", 100, 7, 0.6, 0.6),
    ]
    table = medians(rows)
    assert list(table) == [("multi_turn", "ours"), ("shared_prefix", "ours")]
    arms = table[("multi_turn", "ours")]
    assert list(arms) == ["client_rr", "least_loaded", "cost"]
    assert arms["client_rr"]["ttft_mean_ms"] == 210 and arms["client_rr"]["reuse"] == pytest.approx(0.3)
    assert arms["cost"]["engine_reuse"] is None and arms["cost"]["repeats"] == 2
    # better of the baselines: least_loaded's mean TTFT 160, its wall 10 beside client_rr's 10.5
    assert cost_ratios(arms) == {"cost": (pytest.approx(110 / 160), pytest.approx(8 / 10))}
    assert cost_ratios(table[("shared_prefix", "ours")]) == {}
    lines = summary_lines(rows)
    assert "multi_turn on ours (median of repeats)" in lines[0]
    cost_line = next(line for line in lines if line.split()[0] == "cost" and "better" not in line)
    assert "0.650" in cost_line and " - " in cost_line and "110" in cost_line
    assert any("mean TTFT 0.69x, wall 0.80x" in line for line in lines)
    assert any(line.startswith("\nshared_prefix on ours") for line in lines)
