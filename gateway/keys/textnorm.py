"""The opt-in text rewrites of the `normalized` and `aggressive` key levels (gateway.keys.canonical).

Both change the bytes the tokenizer sees, so a key built with them MAY serve an answer the model would not give to
this exact text; neither is ever a default. Pure and idempotent: a rewritten text rewrites to itself.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

_ZERO_WIDTH: Final = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))
_WHITESPACE_RUN: Final = re.compile(r"\s+")
_FOLD_PASSES: Final = 4


def normalized_text(value: str) -> str:
    """NFC, zero-width characters removed, CRLF/CR -> LF, outer whitespace stripped; inner whitespace kept.

    Opt-in only: every one of these changes the bytes the tokenizer sees, so the answer may differ.

    Zero-width characters go before NFC, since removing one can bring a letter and its accent together.
    """
    value = value.translate(_ZERO_WIDTH).replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", value).strip()


def aggressive_text(value: str) -> str:
    """`normalized_text` plus NFKC, casefold, punctuation (Unicode P*) stripped, whitespace runs collapsed.

    Repeated until stable (in practice one pass, rarely two): deleting punctuation or casefolding can leave
    a string that NFKC would change again, and the result must be idempotent.
    """
    for _ in range(_FOLD_PASSES):
        folded = _fold_once(value)
        if folded == value:
            break
        value = folded
    return value


def _fold_once(value: str) -> str:
    value = unicodedata.normalize("NFKC", normalized_text(value)).casefold()
    value = "".join(ch for ch in value if not unicodedata.category(ch).startswith("P"))
    return _WHITESPACE_RUN.sub(" ", unicodedata.normalize("NFKC", value)).strip()
