"""The cost policy and the policy selector (gateway/upstream/routing/cost.py, policy.py), and the affinity table's
per-backend depths, forgetting and salts: pure, table-driven, with a property and its mutation check."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.upstream.routing import cost
from gateway.upstream.routing.affinity import NO_MATCH, AffinityTable, ids_chain, text_chain
from gateway.upstream.routing.cost import EngineView, Reason, cheapest, estimate
from gateway.upstream.routing.facts import facts_of
from gateway.upstream.routing.policy import Policy, decide


def view(index: int, load: float = 0, matched: int = 0, *, slots: int = 1, wait_s: float = 0.0) -> EngineView:
    return EngineView(index, load, slots, wait_s, 1000.0, matched)


def test_expected_ttft_is_the_queue_wait_plus_the_unmatched_prefill() -> None:
    e = view(0, load=2, matched=300, slots=2, wait_s=0.4)
    got = estimate(e, prompt_tokens=800)
    assert got.wait_s == pytest.approx(0.4)
    assert got.prefill_s == pytest.approx(0.5)  # 500 unmatched tokens at 1000 tokens/s
    assert estimate(view(0, matched=900), prompt_tokens=800).prefill_s == 0


@pytest.mark.parametrize(
    ("engines", "prompt", "chosen", "reason"),
    [
        # a busy engine holding the whole prefix, free in 0.2 s, beats an idle one that must prefill for 10 s
        ([view(0, load=1, matched=10_000, wait_s=0.2), view(1)], 10_000, 0, Reason.PREFIX),
        # ... but not with a queue of 5 s when the idle one prefills in 0.3 s
        ([view(0, load=3, matched=300, wait_s=5.0), view(1)], 300, 1, Reason.SPILL),
        # both free: the matched prefix decides
        ([view(0, matched=200), view(1)], 300, 0, Reason.PREFIX),
        # both busy: a long matched prefix is worth a little more queue ...
        ([view(0, load=1, matched=3000, wait_s=0.6), view(1, load=1, wait_s=0.4)], 3000, 0, Reason.PREFIX),
        # ... a short one is not worth a long queue
        ([view(0, load=3, matched=100, wait_s=1.5), view(1, load=1, wait_s=0.5)], 300, 1, Reason.SPILL),
        # nothing matched anywhere: the least expected wait
        ([view(0, load=1, slots=2), view(1, load=1, wait_s=0.5)], 300, 0, Reason.BALANCE),
    ],
)
def test_cost_choices(engines: list[EngineView], prompt: int, chosen: int, reason: Reason) -> None:
    best, why = cheapest(engines, prompt)
    assert (best.engine.index, why) == (chosen, reason)


def test_cost_ties_go_to_the_most_credit_so_new_prefixes_spread() -> None:
    engines = [
        EngineView(0, 0, 1, 0.0, 1000.0, 0, credit=0.0),
        EngineView(1, 0, 1, 0.0, 1000.0, 0, credit=1.0),
    ]
    assert cheapest(engines, 300)[0].engine.index == 1


engines_st = st.lists(
    st.builds(
        EngineView,
        index=st.just(0),
        load=st.integers(0, 6),
        slots=st.integers(1, 4),
        wait_s=st.floats(0.0, 10.0),
        prefill_tokens_per_s=st.floats(10.0, 10_000.0),
        matched_tokens=st.integers(0, 5000),
        retention=st.floats(0.0, 1.0),  # the share of its matched prefix an engine keeps (`retention`)
        batch_s=st.floats(0.0, 10.0),
        batches_pile=st.booleans(),  # `upstream.pile_up_batches`
    ),
    min_size=1,
    max_size=5,
).map(lambda es: [_renumber(e, i) for i, e in enumerate(es)])


def _renumber(e: EngineView, i: int) -> EngineView:
    return dataclasses.replace(e, index=i)


def _charged(e: EngineView, prompt: int, idle: bool) -> float:
    """What the choice weighs: the expected TTFT, and once more the time a request piles up beside an idle engine
    (a queue's wait, or the overlap of a batch it joins)."""
    x = estimate(e, prompt)
    piles = x.wait_s if e.load >= e.slots else (e.batch_s if e.load and e.batches_pile else 0.0)
    return x.ttft_s + (cost.PILE_UP_WEIGHT * piles if idle else 0.0)


def _waits_only_where_waiting_is_cheaper(engines: list[EngineView], prompt: int) -> None:
    """The chosen engine's charged TTFT is the least of all; so while an engine is idle, a busy one (a second
    request piles up on it, queued or batched) is chosen only for a prefix (it reuses more than every idle engine),
    and only when its wait plus the pile-up charged at PILE_UP_WEIGHT (a queue's wait once more, a batch's overlap)
    is less than the prefill that prefix saves."""
    best, _ = cost.cheapest(engines, prompt)
    idle = any(e.load == 0 for e in engines)

    def piling(e: EngineView) -> bool:
        return e.load >= e.slots or bool(e.load and e.batches_pile)

    free = [e for e in engines if not piling(e)]
    allowed = list(engines)
    if idle:
        deepest = max(f.expected_tokens for f in free)
        allowed = free + [e for e in engines if piling(e) and e.may_queue and e.expected_tokens > deepest]
    assert _charged(best.engine, prompt, idle) <= min(_charged(e, prompt, idle) for e in allowed) + 1e-6
    if idle and piling(best.engine):
        assert all(best.engine.expected_tokens > f.expected_tokens for f in free)
        charged_s = _charged(best.engine, prompt, idle) - best.prefill_s
        for f in free:
            assert charged_s <= estimate(f, prompt).ttft_s - best.prefill_s + 1e-6


@settings(max_examples=200, deadline=None)
@given(engines=engines_st, prompt=st.integers(0, 5000))
def test_property_an_engine_is_waited_for_only_when_that_is_cheaper_than_prefilling_elsewhere(
    engines: list[EngineView], prompt: int
) -> None:
    _waits_only_where_waiting_is_cheaper(engines, prompt)


def test_mutation_the_old_free_slot_rule_fails_the_property(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: only engines with a free slot were considered, so a one-slot engine holding the prefix and free in
    a moment lost every request to the idle one (cost behaved as least-loaded on one-slot fleets)."""
    real = cost.cheapest
    monkeypatch.setattr(
        cost, "cheapest", lambda es, p: real([e for e in es if e.load < e.slots] or list(es), p)
    )
    engines = [view(0, load=1, matched=5000, wait_s=0.1), view(1)]
    with pytest.raises(AssertionError):
        _waits_only_where_waiting_is_cheaper(engines, 5000)


def test_mutation_a_queue_for_a_faster_rate_alone_fails_the_property(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither engine holds the prompt; the busy one's learnt rate is 20% better, so its 0.1 s wait and 2 s
    prefill beat the idle one's 2.5 s even charged twice: queueing beside the idle engine for that alone is the bug
    (the rates differ by their noise). The mutation lets any engine queue beside an idle one."""
    engines = [EngineView(0, 1, 1, 0.1, 1000.0, 0), EngineView(1, 0, 1, 0.0, 800.0, 0)]
    assert cheapest(engines, 2000)[0].engine.index == 1
    real = cost.cheapest

    def any_may_queue(es: list[EngineView], prompt: int) -> tuple[cost.Estimate, cost.Reason]:
        # every busy engine said to hold one token more than it does: the prefix bar never stops it
        said = [
            dataclasses.replace(e, matched_tokens=e.matched_tokens + 1) if e.load >= e.slots else e
            for e in es
        ]
        best, why = real(said, prompt)
        return dataclasses.replace(best, engine=es[best.engine.index]), why

    monkeypatch.setattr(cost, "cheapest", any_may_queue)
    with pytest.raises(AssertionError):
        _waits_only_where_waiting_is_cheaper(engines, 2000)


def test_mutation_a_batch_that_never_piles_up_fails_the_property(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two batching engines (8 slots) whose batches count as pile-up (`upstream.pile_up_batches`), neither holding
    the prompt: the busy one's rate is 20% better and it has a free slot, so it waits for nothing. Joining its batch
    beside the idle engine for that alone is the bug (the second request piles up on it, the fleet's budget pays,
    and nothing is reused); the mutation plays a batching engine with a free slot as idle, as without the setting."""
    batching = EngineView(0, 1, 8, 0.0, 1000.0, 0, batches_pile=True)
    engines = [batching, dataclasses.replace(batching, index=1, load=0, prefill_tokens_per_s=800.0)]
    assert cheapest(engines, 2000)[0].engine.index == 1
    real = cost.cheapest

    def batches_are_free(es: list[EngineView], prompt: int) -> tuple[cost.Estimate, cost.Reason]:
        said = [dataclasses.replace(e, load=0) if e.load < e.slots else e for e in es]
        best, why = real(said, prompt)
        return dataclasses.replace(best, engine=es[best.engine.index]), why

    monkeypatch.setattr(cost, "cheapest", batches_are_free)
    with pytest.raises(AssertionError):
        _waits_only_where_waiting_is_cheaper(engines, 2000)


def test_mutation_a_wait_beside_an_idle_engine_charged_once_fails_the_property(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 3 s wait saves 5 s of prefill on the idle engine: charged once it is taken, and the 3 s of one engine
    queueing beside an idle one (the pile-up the fleet keeps under its budget) buy 2 s."""
    engines = [view(0, load=1, matched=5000, wait_s=3.0), view(1)]
    assert cheapest(engines, 5000)[0].engine.index == 1
    real = cost.cheapest

    def charged_once(es: list[EngineView], prompt: int) -> tuple[cost.Estimate, cost.Reason]:
        return real(es, prompt, 0.0)

    monkeypatch.setattr(cost, "cheapest", charged_once)
    with pytest.raises(AssertionError):
        _waits_only_where_waiting_is_cheaper(engines, 5000)


def _decide(policy: Policy, engines: list[EngineView], turn: int = 0, draw: float = 0.0) -> tuple[int, str]:
    d = decide(
        policy, engines, prompt_tokens=300, legacy=NO_MATCH, load_factor=1.25, turn=turn, rng=lambda: draw
    )
    return d.index, d.reason


def test_the_selector_runs_each_policy() -> None:
    engines = [view(0, load=2, wait_s=1.0), view(1, load=1, wait_s=0.5), view(2, load=0)]
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
