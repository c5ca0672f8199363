"""cdn/tags.py: per-CDN tag headers, tag spelling and truncation (limits cited in cdn/tags.py)."""

from __future__ import annotations

import pytest

from cdn.tags import TAG_TARGETS, edge_tag_values, encode_tag, key_tag, order_tags, tag_headers

DIGEST = "0f" * 32
TAGS = ["model:llama-3", "rev:r2", "tenant:t1", f"key:{DIGEST}"]


def test_key_maps_to_its_digest_tag() -> None:
    assert key_tag(f"te1:pub:{DIGEST}") == f"key:{DIGEST}"
    assert key_tag(f"te1:9c1e:{DIGEST}") == f"key:{DIGEST}"


@pytest.mark.parametrize("bad", ["", "te1:pub", f"xx1:pub:{DIGEST}", "te1:pub:zz", f"te1:pub:{DIGEST}:x"])
def test_malformed_keys_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        key_tag(bad)


def test_order_puts_key_then_tenant_first_and_dedupes() -> None:
    assert order_tags(["x", *TAGS, "tenant:t1"]) == [
        f"key:{DIGEST}",
        "tenant:t1",
        "model:llama-3",
        "rev:r2",
        "x",
    ]


def test_each_target_gets_its_header_and_separator() -> None:
    """Fastly Surrogate-Key (space), Cloudflare Cache-Tag (comma), xkey (space), Akamai Edge-Cache-Tag (comma)."""
    headers, truncated = tag_headers(TAGS, ["surrogate-key", "cache-tag", "xkey", "akamai"])
    ordered = f"key:{DIGEST} tenant:t1 model:llama-3 rev:r2"
    assert truncated == 0
    assert headers["Surrogate-Key"] == ordered
    assert headers["xkey"] == ordered
    assert headers["Cache-Tag"] == ordered.replace(" ", ",")
    # Akamai disallows ':' in cache tags: it is %-escaped, the same way the purge client spells it.
    assert headers["Edge-Cache-Tag"] == f"key%3A{DIGEST},tenant%3At1,model%3Allama-3,rev%3Ar2"


def test_no_targets_or_no_tags_give_no_headers() -> None:
    assert tag_headers(TAGS, []) == ({}, 0)
    assert tag_headers([], ["surrogate-key", "akamai"]) == ({}, 0)


def test_unknown_target_is_an_error() -> None:
    with pytest.raises(ValueError):
        tag_headers(TAGS, ["cloudfront"])


def test_separators_and_spaces_inside_a_tag_are_escaped() -> None:
    assert encode_tag("model:a b,c%", "surrogate-key") == "model:a%20b%2Cc%25"
    assert encode_tag("model:org/name", "akamai") == "model%3Aorg%2Fname"
    assert encode_tag("model:é", "cache-tag") == "model:%C3%A9"


def test_truncation_drops_whole_tags_from_the_end_keeping_key_and_tenant() -> None:
    big = [f"model:{'m' * 1000}", f"rev:{'r' * 1000}"] + [f"x{i}:{'v' * 1000}" for i in range(30)]
    headers, truncated = tag_headers([*big, "tenant:t1", f"key:{DIGEST}"], ["surrogate-key"])
    value = headers["Surrogate-Key"]
    kept = value.split(" ")
    assert len(value) <= 16_384
    assert kept[:2] == [f"key:{DIGEST}", "tenant:t1"]
    assert all(t in [*big, "tenant:t1", f"key:{DIGEST}"] for t in kept)  # no tag cut in half
    assert truncated == 34 - len(kept)


def test_akamai_keeps_at_most_128_tags_and_drops_tags_over_128_chars() -> None:
    tags = [f"key:{DIGEST}", f"model:{'m' * 200}"] + [f"t{i}" for i in range(200)]
    headers, truncated = tag_headers(tags, ["akamai"])
    kept = headers["Edge-Cache-Tag"].split(",")
    assert len(kept) == 128 and kept[0] == f"key%3A{DIGEST}"
    assert all(len(t) <= 128 for t in kept)
    assert len(headers["Edge-Cache-Tag"]) <= TAG_TARGETS["akamai"].max_value_bytes
    assert truncated == 202 - 128


def test_cloudflare_keeps_at_most_1000_tags() -> None:
    headers, truncated = tag_headers([f"t{i}" for i in range(1200)], ["cache-tag"])
    assert len(headers["Cache-Tag"].split(",")) == 1000 and truncated == 200


def test_truncation_counts_are_summed_over_targets() -> None:
    tags = [f"t{i}" for i in range(130)]
    _, truncated = tag_headers(tags, ["akamai", "surrogate-key", "akamai"])
    assert truncated == 2  # akamai drops 2, Fastly keeps all; a repeated target counts once


def test_purge_values_match_header_spelling() -> None:
    values, dropped = edge_tag_values(TAGS, "akamai")
    headers, _ = tag_headers(TAGS, ["akamai"])
    assert headers["Edge-Cache-Tag"].split(",") == values and dropped == 0
