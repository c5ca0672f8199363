"""gateway.ops.dashboard.history, hotkeys and cost: pure logic, table-driven, with an injected clock."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from gateway.config.cost import parse_prices, saved_usd
from gateway.keys.entry import Entry
from gateway.ops.dashboard.history import WINDOWS, History, figures, snapshot
from gateway.ops.dashboard.hotkeys import HotKeys, merged, other_workers, prompt_text


def snap(
    hit: float = 0, miss: float = 0, bypass: float = 0, error: float = 0, tokens: float = 0
) -> dict[str, float]:
    return {
        "req|hit": hit,
        "req|miss": miss,
        "req|bypass": bypass,
        "req|error": error,
        "tokens_saved": tokens,
        "why|bypass|temperature": bypass,
    }


def test_snapshot_flattens_the_charted_counters() -> None:
    samples = {
        "tokenedge_requests_total": [
            ({"route": "a", "result": "hit", "reason": "l1"}, 3.0),
            ({"route": "b", "result": "hit", "reason": "l2"}, 1.0),
            ({"route": "a", "result": "bypass", "reason": "n"}, 2.0),
        ],
        "tokenedge_request_duration_seconds_bucket": [
            ({"result": "coalesced", "le": "0.1"}, 2.0),
            ({"result": "miss", "le": "0.1"}, 1.0),
            ({"result": "bypass", "le": "0.1"}, 9.0),
        ],
        "tokenedge_cost_saved_usd_total": [({}, 0.5)],
    }
    s = snapshot(samples)
    assert s["req|hit"] == 4 and s["why|bypass|n"] == 2 and "why|hit|l1" not in s
    assert s["lat|miss|0.1"] == 3 and "lat|bypass|0.1" not in s and s["cost_saved_usd"] == 0.5


def test_hit_rate_counts_lookups_only() -> None:
    f = figures({"req|hit": 3, "req|miss": 1, "req|bypass": 50, "req|error": 50})
    assert f["hit_rate"] == 0.75
    assert figures({"req|bypass": 5})["hit_rate"] is None


def test_rings_keep_one_snapshot_per_step_and_stay_bounded() -> None:
    history = History()
    for t in range(0, 200_000, 5):
        history.record(float(t), snap(hit=t))
    for name, ring in history._rings.items():
        span, step = WINDOWS[name]
        assert len(ring) == ring.maxlen == int(span // step) + 2
        times = [t for t, _ in ring]
        assert all(b - a == step for a, b in itertools.pairwise(times))


def test_window_series_are_interval_differences_and_totals_span_the_window() -> None:
    history = History({"w": (30.0, 10.0)})
    history.record(0.0, snap())
    history.record(10.0, snap(hit=2, miss=2, bypass=1))
    history.record(20.0, snap(hit=5, miss=3, bypass=1, tokens=40))
    window = history.window("w", 25.0, snap(hit=6, miss=3, bypass=4, error=1, tokens=50))
    assert window["t"] == [10.0, 20.0, 25.0] and window["start"] == 0.0
    assert window["series"]["requests"]["hit"] == [2, 3, 1]
    assert window["series"]["hit_rate"] == [0.5, 0.75, 1.0]
    assert window["series"]["tokens_saved"] == [0, 40, 10]
    assert window["totals"]["requests"]["bypass"] == 4 and window["totals"]["hit_rate"] == 6 / 9
    assert window["totals"]["reasons"] == [{"result": "bypass", "reason": "temperature", "count": 4}]
    later = history.window("w", 55.0, snap(hit=6, miss=3, bypass=4, error=1, tokens=50))
    assert later["start"] == 20.0 and later["totals"]["requests"]["hit"] == 1  # older steps fell out


def entry(key: str, created_at: float = 100.0) -> Entry:
    return Entry(
        key=key,
        endpoint="chat/completions",
        body=b"{}",
        model="m",
        revision="r",
        created_at=created_at,
        ttl_s=60,
        stale_if_error_s=0,
        etag='"x"',
        tags=(),
    )


def test_hot_keys_count_and_trim_to_the_most_hit() -> None:
    keys = HotKeys(capacity=2)
    for i, hits in enumerate([5, 1, 4, 1, 1]):
        for _ in range(hits):
            keys.hit(entry(f"te1:t{i}:d{i}"), 200.0)
    # t4 found the table full (2 * capacity): it was trimmed to the 2 most hit (t0, t2), then t4 was added
    assert sorted(r["key"] for r in keys.rows()) == ["te1:t0:d0", "te1:t2:d2", "te1:t4:d4"]
    assert {r["key"]: r["hits"] for r in keys.rows()}["te1:t0:d0"] == 5


def test_merged_tables_add_hits_and_show_no_prompt_unless_asked() -> None:
    a = [
        {
            "key": "te1:abc:1",
            "hits": 2,
            "model": "m",
            "route": "r",
            "created_at": 10.0,
            "last_hit": 50.0,
            "prompt": "secret question",
        }
    ]
    b = [{**a[0], "hits": 3, "created_at": 40.0, "last_hit": 60.0}]
    (row,) = merged([a, b], now=100.0, top=5, show_prompts=False)
    assert row == {"key": "te1:abc:1", "tenant": "abc", "model": "m", "route": "r", "hits": 5, "age_s": 60.0}
    assert merged([a], now=100.0, top=5, show_prompts=True)[0]["prompt"] == "secret question"


def test_other_workers_tables_are_read_when_their_process_is_alive(tmp_path: Path) -> None:
    mine = HotKeys()
    mine.hit(entry("te1:t:1"), 1.0)
    mine.save(str(tmp_path))
    live, dead = tmp_path / f"hotkeys_{os.getppid()}.json", tmp_path / "hotkeys_999999999.json"
    (tmp_path / f"hotkeys_{os.getpid()}.json").rename(live)
    dead.write_bytes(live.read_bytes())
    assert [[row["key"] for row in table] for table in other_workers(str(tmp_path))] == [["te1:t:1"]]


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (
            {
                "messages": [
                    {"role": "user", "content": "first"},
                    {"role": "assistant", "content": "a"},
                    {"role": "user", "content": [{"type": "text", "text": "last"}]},
                ]
            },
            "last",
        ),
        ({"prompt": "x" * 200}, "x" * 80),
        ({"input": ["one", "two"]}, "one"),
        ({"prompt": [1, 2, 3]}, None),
    ],
)
def test_prompt_text(body: dict, text: str | None) -> None:
    assert prompt_text(body) == text


def test_prices_parse_and_price_usage() -> None:
    prices = parse_prices(["gpt-4o-mini=0.15/0.60", "*=1/2"])
    usage = {"prompt_tokens": 1_000_000, "completion_tokens": 500_000}
    assert saved_usd(prices, "gpt-4o-mini", usage) == pytest.approx(0.15 + 0.30)
    assert saved_usd(prices, "other", usage) == pytest.approx(2.0)
    assert saved_usd({}, "other", usage) == 0.0
    for bad in ("m=1", "=1/2", "m=a/b", "m=-1/2"):
        with pytest.raises(ValueError, match="MODEL=INPUT/OUTPUT"):
            parse_prices([bad])
