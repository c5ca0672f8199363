"""What an object really costs in this process: the bytes the allocator hands out for it, not its payload length.

`sys.getsizeof` gives an object's own size (with the GC header for tracked objects); CPython's small-object
allocator then rounds every request up to 16 bytes (requests up to 512 bytes), and larger ones go to malloc, which
adds its own chunk header. One more trap: `orjson.dumps` returns a bytes object that keeps its whole growth buffer
(a 700-byte answer can hold 4 KB) while `sys.getsizeof` reports only the used length; anything a cache keeps for
long is therefore `compact`ed first (one copy into an exact-size object). Budgets (L1, the request memo) are charged with these numbers, and the tests check them
against `tracemalloc` and RSS, so a bound in bytes is a bound on memory actually held.
"""

from __future__ import annotations

import sys
from typing import Any

_SMALL = 512
_MALLOC_OVERHEAD = 16


def alloc(n: int) -> int:
    """Bytes held for an allocation of `n` bytes."""
    return (n + 15) & ~15 if n <= _SMALL else n + _MALLOC_OVERHEAD


def held(obj: object) -> int:
    """Bytes held by `obj` itself (not what it refers to)."""
    return alloc(sys.getsizeof(obj))


def json_held(value: Any) -> int:
    """Bytes held by a JSON-like value (dict/list/str/int/float/bool/None) and everything inside it.

    Singletons (None, booleans, small ints) cost nothing extra; strings are counted even when interned elsewhere,
    so this can only overcount.
    """
    if value is None or value is True or value is False:
        return 0
    if isinstance(value, int) and -5 <= value <= 256:
        return 0
    total = held(value)
    if isinstance(value, dict):
        for k, v in value.items():
            total += json_held(k) + json_held(v)
    elif isinstance(value, list | tuple):
        for item in value:
            total += json_held(item)
    return total


def compact(data: bytes) -> bytes:
    """An exact-size copy of `data`, whose allocation may be larger than its length (orjson output)."""
    return memoryview(data).tobytes()
