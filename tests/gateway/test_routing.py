"""The router's pure parts: the breaker, prefix chains and the affinity table, the choice, the revision book."""

from __future__ import annotations

import orjson
import pytest

from gateway.upstream.routing.affinity import AffinityTable, ids_chain, prompt_text, text_chain
from gateway.upstream.routing.book import RevisionBook, merge
from gateway.upstream.routing.breaker import Breaker, BreakerState
from gateway.upstream.routing.choose import Candidate, Choice, choose, guard
from gateway.upstream.routing.facts import facts_of
from tokenedge_wire.framing import encode_request


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_consecutive_failures_and_backs_off_exponentially() -> None:
    clock = Clock()
    breaker = Breaker(threshold=3, base_s=1.0, max_s=3.0, clock=clock)
    assert not breaker.failure() and not breaker.failure()
    breaker.success()  # a success resets the run
    assert not breaker.failure() and not breaker.failure()
    assert breaker.failure() and breaker.state is BreakerState.OPEN and not breaker.available()
    clock.now += 1.0
    assert breaker.state is BreakerState.HALF_OPEN and breaker.available()
    breaker.begin()  # the one trial
    assert not breaker.available()
    assert breaker.failure()  # the trial failed: open again, for twice as long
    clock.now += 1.5
    assert breaker.state is BreakerState.OPEN
    clock.now += 0.5
    breaker.begin()
    breaker.success()
    assert breaker.state is BreakerState.CLOSED and breaker.ejections == 2
    for _ in range(3):
        breaker.failure()
    clock.now += 1.0  # the backoff was reset by the close
    assert breaker.state is BreakerState.HALF_OPEN


def test_chains_hash_whole_blocks_and_name_the_whole_prefix() -> None:
    a, b = text_chain("x" * 64 + "y" * 64 + "tail", 64), text_chain("x" * 64 + "z" * 64, 64)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]
    assert text_chain("z" * 64 + "y" * 64, 64)[1] != a[1]  # same block, different prefix: different hash
    assert text_chain("short", 64) == []
    assert ids_chain(list(range(40)), 16) == ids_chain([*range(32), 7], 16)
    assert ids_chain(list(range(16)), 16) != text_chain("".join(map(chr, range(16))), 16)


def test_prompt_text_renders_roles_contents_and_parts() -> None:
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"text": "hi"}]}]}
    assert prompt_text(chat) == "system\x1fS\x1euser\x1fhi\x1e"
    assert prompt_text({"prompt": ["p"]}) == "p" and prompt_text({"prompt": [1, 2]}) is None


def test_the_longest_match_wins_and_marks_a_continuation() -> None:
    table = AffinityTable(100)
    short, long_ = [1, 2], [1, 2, 3, 4]
    table.record(long_, 0)
    table.record(short, 1)  # blocks 1, 2 now last sent to backend 1
    match = table.match([1, 2, 3, 4, 5], [0, 1, 2])
    assert (match.backend, match.depth, match.extends) == (0, 4, True)
    branch = table.match([1, 2, 3, 9], [0, 1, 2])
    assert (branch.backend, branch.depth, branch.extends) == (0, 3, False)
    assert table.match([1, 2, 3, 4], [1, 2]).backend == 1  # backend 0 not allowed: the next longest
    assert table.match([9], [0, 1]).backend is None


def test_the_table_is_bounded() -> None:
    table = AffinityTable(3)
    table.record([1, 2, 3, 4, 5], 0)
    assert (
        len(table) == 3
        and table.match([1], [0]).backend is None
        and table.match([1, 2, 3, 4, 5], [0]).depth == 5
    )


@pytest.mark.parametrize(
    ("loads", "affine", "extends", "expected", "how"),
    [
        ([0, 0, 0], 2, True, 2, Choice.AFFINITY),
        ([4, 2, 3], 0, True, 0, Choice.AFFINITY),  # 4 <= 1.25 * 3 + ... max(3.75, 4)
        ([6, 1, 2], 0, True, 1, Choice.GUARDED),  # 6 > max(3.75, 4)
        ([4, 2, 3], 0, False, 0, Choice.AFFINITY),  # a shared prefix: 4 <= mean + 1
        ([5, 2, 2], 0, False, 1, Choice.GUARDED),  # 5 > 4, though 5 <= 1.25 x mean would pass
        ([3, 1, 2], None, True, 1, Choice.LEAST_LOADED),
    ],
)
def test_choose(loads: list[int], affine: int | None, extends: bool, expected: int, how: Choice) -> None:
    candidates = [Candidate(i, load, 1.0) for i, load in enumerate(loads)]
    chosen, why = choose(candidates, affine, 1.25, extends=extends)
    assert (chosen.index, why) == (expected, how)


def test_weights_scale_the_load_and_ties_go_to_the_most_credit() -> None:
    heavy = [Candidate(0, 2, 2.0), Candidate(1, 1.5, 1.0)]
    assert choose(heavy, None, 1.25)[0].index == 0  # 2 / 2 < 1.5 / 1
    idle = [Candidate(0, 0, 1.0, credit=1), Candidate(1, 0, 1.0, credit=3), Candidate(2, 1, 1.0, credit=4)]
    assert choose(idle, None, 1.25)[0].index == 1  # the most credit among the least loaded
    assert guard(0.0, 1.5) == 1.0 and guard(10.0, 1.5) == 15.0


def test_the_book_keeps_the_newest_revision_even_when_its_backends_go_quiet() -> None:
    changes: list[tuple[str, str]] = []
    book = RevisionBook(3)
    book.on_change = lambda m, r: changes.append((m, r))
    for b in range(3):
        book.report(b, {"m": "r1"})
    book.report(1, {"m": "r2"})  # backend 1 moved: r2 is newer, though two backends still say r1
    assert book.current("m") == "r2" and changes == [("m", "r1"), ("m", "r2")]
    assert book.arbitrate("m", "r2") and not book.arbitrate("m", "r1")
    book.saw(0, "m", "r1")  # an answer from a backend still at r1 changes nothing
    assert book.current("m") == "r2"
    book.saw(2, "m", "r3")  # a third revision learnt from an answer header
    assert book.current("m") == "r3" and book.serves(2, "m") and book.serves(1, "x") is False
    assert book.arbitrate("m", "r4") and book.current("m") == "r4"  # another process saw r4 first: adopted
    assert not book.arbitrate("m", "r3") and changes[-1] == ("m", "r3")  # adopted quietly: the catalog asked


def test_revisions_first_seen_side_by_side_pick_the_majority_then_the_name() -> None:
    book = RevisionBook(3)
    book.report(0, {"m": "b"})
    book.report(1, {"m": "a"})
    assert book.current("m") == "b"  # a tie of one each: the greater name, the same in every process
    book.report(2, {"m": "a"})
    assert book.current("m") == "a"


def test_merge_lists_each_model_once_at_its_current_revision() -> None:
    def listing(*items: tuple[str, str]) -> bytes:
        return orjson.dumps({"data": [{"id": i, "tokenedge": {"revision": r}} for i, r in items]})

    book = RevisionBook(2)
    one, two = listing(("m", "r1"), ("only-a", "x")), listing(("m", "r2"), ("only-b", "y"))
    book.report(0, {"m": "r1", "only-a": "x"})
    book.report(1, {"m": "r2", "only-b": "y"})
    book.report(0, {"m": "r2", "only-a": "x"})
    book.report(0, {"m": "r1", "only-a": "x"})  # moved back: r1 is now the newest
    merged = {i["id"]: i for i in orjson.loads(merge([one, two], book))["data"]}
    assert set(merged) == {"m", "only-a", "only-b"} and merged["m"]["tokenedge"]["revision"] == "r1"
    assert book.arbitrate("m", "r9")  # known only from another process so far
    assert orjson.loads(merge([one, two], book))["data"][0]["tokenedge"]["revision"] == "r9"


def test_merge_promises_seeded_invariance_only_where_every_backend_does() -> None:
    def listing(model: str, promise: bool) -> bytes:
        item = {"id": model, "tokenedge": {"revision": "r1", "seeded_invariant": promise}}
        return orjson.dumps({"data": [item]})

    book = RevisionBook(3)
    for index in range(3):
        book.report(index, {"m": "r1", "both": "r1"})
    bodies = [listing("m", True), listing("m", False), listing("both", True), listing("both", True)]
    merged = {i["id"]: i["tokenedge"] for i in orjson.loads(merge(bodies, book))["data"]}
    assert merged["m"]["seeded_invariant"] is False  # one backend of m draws batch-dependent seeded samples
    assert merged["both"]["seeded_invariant"] is True


def test_facts_read_the_model_and_the_prompt_of_json_and_binary_bodies() -> None:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 100}]})
    facts = facts_of("POST", "/v1/chat/completions", body, block_chars=16, block_tokens=4, affinity=True)
    assert facts.model == "m" and len(facts.chain) == (len("user\x1f") + 100 + 1) // 16
    embed = facts_of(
        "POST", "/v1/embeddings?x=1", b'{"model": "e"}', block_chars=16, block_tokens=4, affinity=True
    )
    assert embed.model == "e" and embed.chain == ()
    binary = encode_request({"endpoint": "chat", "params": {"model": "m"}}, list(range(10)))
    facts = facts_of("POST", "/v1/tokens/generate", binary, block_chars=16, block_tokens=4, affinity=True)
    assert facts.model == "m" and facts.chain == tuple(ids_chain(list(range(10)), 4))
    assert (
        facts_of("POST", "/v1/chat/completions", b"{bad", block_chars=16, block_tokens=4, affinity=True).model
        is None
    )
    assert facts_of("GET", "/v1/models", None, block_chars=16, block_tokens=4, affinity=True).model is None
