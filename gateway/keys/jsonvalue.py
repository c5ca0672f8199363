"""JSON values as plain Python, validated and with numbers normalized: what canonical forms are made of.

`plain_json` is a deep copy that admits only what JSON can say (RFC 8259): string keys, valid Unicode, finite
numbers, integers orjson can write, bounded nesting; `1.0` becomes `1` and `-0.0` becomes `0`, so equal numbers are
equal bytes. Member order is kept as given. Everything else is a CanonicalizationError, fit for a 400. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final


class CanonicalizationError(ValueError):
    """The request is not representable as canonical JSON; the message is fit for a 400 response."""


# JSON nesting deeper than this is refused instead of overflowing the Python stack.
MAX_DEPTH: Final = 128
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1  # orjson writes integers in [-2^63, 2^64 - 1]


def plain_json(value: Any, depth: int = 0) -> Any:
    """A deep copy of `value` as plain JSON types with numbers normalized; raises CanonicalizationError.

    Exact types first, most frequent first: this walk is most of what a new key costs."""
    kind = type(value)
    if kind is str:
        return value if value.isascii() else _valid_str(value)
    if kind is dict or kind is list:
        if depth >= MAX_DEPTH:
            raise CanonicalizationError(f"JSON nested deeper than {MAX_DEPTH} levels")
        if kind is list:
            return [plain_json(item, depth + 1) for item in value]
        return {_key(key): plain_json(item, depth + 1) for key, item in value.items()}
    if kind is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise CanonicalizationError("integer outside the 64-bit range")
        return value
    if kind is float:
        return _number(value)
    if value is None or kind is bool:
        return value
    return _plain_subclass(value, depth)


def _plain_subclass(value: Any, depth: int) -> Any:
    """Mappings, tuples and subclasses of the JSON types, as the plain type."""
    if isinstance(value, str):
        return plain_json(str.__str__(value), depth)  # the characters, whatever the subclass's __str__
    for plain in (bool, int, float):  # bool before int: True is an int
        if isinstance(value, plain):
            return plain_json(plain(value), depth)
    if isinstance(value, Mapping):
        return plain_json(dict(value), depth)
    if isinstance(value, list | tuple):
        return plain_json(list(value), depth)
    raise CanonicalizationError(f"not a JSON value: {type(value).__name__}")


def _key(key: Any) -> str:
    if type(key) is str and key.isascii():
        return key
    if not isinstance(key, str):
        raise CanonicalizationError("JSON object keys must be strings")
    return _valid_str(str(key))


def _number(value: float) -> int | float:
    # RFC 8259 §6: NaN and Infinity are not JSON numbers.
    if math.isnan(value) or math.isinf(value):
        raise CanonicalizationError("NaN and Infinity are not valid JSON numbers")
    if value.is_integer() and _INT_MIN <= value < 2**63:
        return int(value)  # 1.0 -> 1 and -0.0 -> 0
    return value


def _valid_str(value: str) -> str:
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CanonicalizationError("string is not valid Unicode (lone surrogate)") from exc
    return value
