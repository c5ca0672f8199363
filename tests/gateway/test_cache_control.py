"""Tests for gateway/keys/cache_control.py: RFC 9111 §5.2.1 request directives, tolerant parsing."""

from __future__ import annotations

import pytest

from gateway.keys.cache_control import MAX_DELTA_SECONDS, RequestDirectives, parse_request_cache_control

D = RequestDirectives

CASES = [
    ("absent", None, D()),
    ("empty", "", D()),
    ("blank", "  ", D()),
    ("no-cache", "no-cache", D(no_cache=True)),
    ("no-store", "no-store", D(no_store=True)),
    ("only-if-cached", "only-if-cached", D(only_if_cached=True)),
    ("max-age", "max-age=60", D(max_age_s=60)),
    ("max-age zero", "max-age=0", D(max_age_s=0)),
    ("case-insensitive names", "No-Cache, MAX-AGE=5", D(no_cache=True, max_age_s=5)),
    (
        "whitespace around everything",
        "  no-store ,\tmax-age = 7 ,only-if-cached ",
        D(no_store=True, max_age_s=7, only_if_cached=True),
    ),
    ("quoted max-age accepted", 'max-age="30"', D(max_age_s=30)),
    ("unknown directives ignored", "foo, bar=baz, max-stale=10, min-fresh=5, no-transform", D()),
    ("unknown with quoted comma", 'ext="a, no-store", no-cache', D(no_cache=True)),
    ("escaped quote inside quoted string", r'ext="a\", no-store", max-age=3', D(max_age_s=3)),
    ("empty elements", ",,no-cache,,", D(no_cache=True)),
    ("no-cache with an argument", 'no-cache="authorization"', D(no_cache=True)),
    ("invalid max-age is zero", "max-age=abc", D(max_age_s=0)),
    ("negative max-age is zero", "max-age=-5", D(max_age_s=0)),
    ("fractional max-age is zero", "max-age=1.5", D(max_age_s=0)),
    ("max-age without value is zero", "max-age", D(max_age_s=0)),
    ("max-age empty value is zero", "max-age=", D(max_age_s=0)),
    ("non-ASCII digits are invalid", "max-age=٣", D(max_age_s=0)),
    ("huge max-age clamped to 2^31", "max-age=99999999999999999999", D(max_age_s=MAX_DELTA_SECONDS)),
    ("repeated max-age: smallest wins", "max-age=60, max-age=10", D(max_age_s=10)),
    ("everything", "no-cache, no-store, max-age=1, only-if-cached", D(True, True, 1, True)),
    ("unterminated quote", 'ext="abc, no-store', D()),
]


@pytest.mark.parametrize(("value", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_request_cache_control(value: str | None, expected: RequestDirectives) -> None:
    assert parse_request_cache_control(value) == expected


PRAGMA = [
    ("pragma no-cache without cache-control", None, "no-cache", D(no_cache=True)),
    ("pragma case-insensitive", None, "No-Cache", D(no_cache=True)),
    ("pragma among others", "", "foo, no-cache", D(no_cache=True)),
    ("other pragma ignored", None, "foo=bar", D()),
    ("cache-control wins over pragma", "max-age=5", "no-cache", D(max_age_s=5)),
    ("no pragma", None, None, D()),
]


@pytest.mark.parametrize(("value", "pragma", "expected"), [c[1:] for c in PRAGMA], ids=[c[0] for c in PRAGMA])
def test_pragma_no_cache_counts_only_without_cache_control(
    value: str | None, pragma: str | None, expected: RequestDirectives
) -> None:
    assert parse_request_cache_control(value, pragma) == expected


def test_defaults_are_no_directives() -> None:
    assert RequestDirectives() == D(no_cache=False, no_store=False, max_age_s=None, only_if_cached=False)
