"""The cost policy and the policy selector (gateway/upstream/routing/cost.py, policy.py), and the affinity table's
per-backend depths, forgetting and salts: pure, table-driven, with a property and its mutation check."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.upstream.routing import cost
from gateway.upstream.routing.affinity import NO_MATCH, AffinityTable, ids_chain, text_chain
from gateway.upstream.routing.cost import EngineView, Reason, cheapest, estimate
from gateway.upstream.routing.facts import facts_of
from gateway.upstream.routing.policy import Policy, decide


def view(
    index: int, load: float = 0, matched: int = 0, *, slots: int = 1, service_s: float = 0.5
) -> EngineView:
    return EngineView(index, load, slots, service_s, 1000.0, matched)


def test_expected_ttft_is_the_queue_wait_plus_the_unmatched_prefill() -> None:
    e = view(0, load=2, matched=300, slots=2, service_s=0.4)
    got = estimate(e, prompt_tokens=800)
    assert got.wait_s == pytest.approx(0.4)  # 2 requests x 0.4 s over 2 slots
    assert got.prefill_s == pytest.approx(0.5)  # 500 unmatched tokens at 1000 tokens/s
    assert estimate(view(0, matched=900), prompt_tokens=800).prefill_s == 0


@pytest.mark.parametrize(
    ("engines", "prompt", "chosen", "reason"),
    [
        # an idle engine wins over a busy one holding the whole prefix: affinity never leaves one idle
        ([view(0, load=1, matched=10_000), view(1)], 10_000, 1, Reason.SPILL),
        # both free: the matched prefix decides
        ([view(0, matched=200), view(1)], 300, 0, Reason.PREFIX),
        # both busy: a long matched prefix is worth a short queue ...
        ([view(0, load=1, matched=3000), view(1, load=1)], 3000, 0, Reason.PREFIX),
        # ... a short one is not worth a long queue
        ([view(0, load=3, matched=100), view(1, load=1)], 300, 1, Reason.SPILL),
        # nothing matched anywhere: the least expected wait
        ([view(0, load=1, slots=2), view(1, load=1)], 300, 0, Reason.BALANCE),
    ],
)
def test_cost_choices(engines: list[EngineView], prompt: int, chosen: int, reason: Reason) -> None:
    best, why = cheapest(engines, prompt)
    assert (best.engine.index, why) == (chosen, reason)


def test_cost_ties_go_to_the_most_credit_so_new_prefixes_spread() -> None:
    engines = [
        EngineView(0, 0, 1, 0.5, 1000.0, 0, credit=0.0),
        EngineView(1, 0, 1, 0.5, 1000.0, 0, credit=1.0),
    ]
    assert cheapest(engines, 300)[0].engine.index == 1


engines_st = st.lists(
    st.builds(
        EngineView,
        index=st.just(0),
        load=st.integers(0, 6),
        slots=st.integers(1, 4),
        service_s=st.floats(0.01, 5.0),
        prefill_tokens_per_s=st.floats(10.0, 10_000.0),
        matched_tokens=st.integers(0, 5000),
    ),
    min_size=1,
    max_size=5,
).map(lambda es: [_renumber(e, i) for i, e in enumerate(es)])


def _renumber(e: EngineView, i: int) -> EngineView:
    return EngineView(i, e.load, e.slots, e.service_s, e.prefill_tokens_per_s, e.matched_tokens)


def _never_queues_beside_an_idle_slot(engines: list[EngineView], prompt: int) -> None:
    best, _ = cheapest(engines, prompt)
    if any(e.load < e.slots for e in engines):
        assert best.engine.load < best.engine.slots


@settings(max_examples=200, deadline=None)
@given(engines=engines_st, prompt=st.integers(0, 5000))
def test_property_no_engine_queues_while_another_has_a_free_slot(
    engines: list[EngineView], prompt: int
) -> None:
    _never_queues_beside_an_idle_slot(engines, prompt)


def test_mutation_without_the_free_slot_rule_the_property_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cost, "free", lambda e: True)
    engines = [view(0, load=1, matched=5000), view(1)]
    with pytest.raises(AssertionError):
        _never_queues_beside_an_idle_slot(engines, 5000)


def _decide(policy: Policy, engines: list[EngineView], turn: int = 0, draw: float = 0.0) -> tuple[int, str]:
    d = decide(
        policy, engines, prompt_tokens=300, legacy=NO_MATCH, load_factor=1.25, turn=turn, rng=lambda: draw
    )
    return d.index, d.reason


def test_the_selector_runs_each_policy() -> None:
    engines = [view(0, load=2), view(1, load=1), view(2, load=0)]
    assert [_decide(Policy.ROUND_ROBIN, engines, turn=t)[0] for t in range(4)] == [0, 1, 2, 0]
    assert (
        _decide(Policy.RANDOM, engines, draw=0.0)[0] == 0
        and _decide(Policy.RANDOM, engines, draw=0.99)[0] == 2
    )
    assert _decide(Policy.LEAST_LOADED, engines) == (2, "least_loaded")
    assert _decide(Policy.AFFINITY, engines) == (2, "miss")
    assert _decide(Policy.COST, engines) == (2, "balance")


def test_the_table_knows_every_backend_a_prefix_went_to_and_forgets_an_ejected_one() -> None:
    table = AffinityTable(100)
    shared, longer = [1, 2], [1, 2, 3, 4]
    table.record(longer, 0)
    table.record(shared, 1)
    assert table.depths(longer, [0, 1, 2]) == {0: 4, 1: 2, 2: 0}
    assert table.match(shared, [0, 1]).backend == 1  # the last one sent it
    table.forget(1)
    assert table.depths(longer, [0, 1]) == {0: 4, 1: 0}
    assert table.match(shared, [0, 1]).backend == 0  # its entries passed to the other holder
    table.forget(0)
    assert len(table) == 0


def test_salted_chains_never_match_across_tenants() -> None:
    text = "s" * 256
    a, b = text_chain(text, 64, "tenant-a"), text_chain(text, 64, "tenant-b")
    assert not set(a) & set(b) and set(text_chain(text, 64)).isdisjoint(a)
    assert text_chain(text, 64, "tenant-a") == a
    assert ids_chain(list(range(32)), 16, "x") != ids_chain(list(range(32)), 16)
    body = b'{"model":"m","messages":[{"role":"user","content":"' + b"q" * 300 + b'"}],"cache_salt":"t1"}'
    facts = facts_of("POST", "/v1/chat/completions", body, block_chars=64, block_tokens=16, affinity=True)
    unsalted = facts_of(
        "POST",
        "/v1/chat/completions",
        body.replace(b',"cache_salt":"t1"', b""),
        block_chars=64,
        block_tokens=16,
        affinity=True,
    )
    assert facts.chain and not set(facts.chain) & set(unsalted.chain)
    assert facts.prompt_tokens == unsalted.prompt_tokens > 70 and not facts.stream
