"""Phrase splicing: hot phrases with precomputed ids, spliced in where the pre-tokenizer is known to split.

tiktoken encodes a text as the concatenation of BPE(piece) over the pieces its regex finds, so precomputed ids
for a span can be spliced in exactly when both ends of the span are piece boundaries of the whole text and the
regex finds the same pieces inside the span alone. We splice only at *line anchors*: a position i with
text[i-1] == "\\n", text[i-2] and text[i] not whitespace (or the ends of the text). For the patterns below no
regex match can contain such a newline together with either neighbour (only the `\\s` alternatives match
"\\n", and `[\\r\\n]*` suffixes stop at non-newlines), none of them looks behind, and the lone "\\n" is the
same piece whether the text goes on or ends there (cl100k's `\\s++$` takes it at the end, `\\s*[\\r\\n]`
inside); `tests/gateway/test_tokens_encode.py` checks equality with plain `encode` on random text. Other
patterns are not spliced (the encoder falls back to plain encode).

Only ids the model's own encoder produced are ever spliced: adding new token ids for domain terms is
refused, because the model has no trained embedding for them and it would change what the model sees.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tokenedge_wire.pattern import GPT2, GPT2_SINGLE_DIGITS, LLAMA3

CL100K = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
CL100K_OLD = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SPLICE_SAFE_PATTERNS = frozenset(
    {GPT2, GPT2_SINGLE_DIGITS, LLAMA3, CL100K, CL100K_OLD}
)  # CL100K: tiktoken >= 0.8


def is_anchor(text: str, i: int) -> bool:
    """True where every supported pre-tokenizer splits, whatever the text around it."""
    if i == 0 or i == len(text):
        return True
    return text[i - 1] == "\n" and not text[i].isspace() and (i < 2 or not text[i - 2].isspace())


class PhraseRejected(ValueError):
    """A configured phrase that can never be spliced exactly (the message says why)."""


def check_phrase(phrase: str, specials: Iterable[str]) -> None:
    if len(phrase) < 2 or not phrase.endswith("\n") or phrase[0].isspace() or phrase[-2].isspace():
        raise PhraseRejected(
            "a phrase must be whole lines: start with a non-space and end with '<non-space>\\n'"
        )
    if any(s in phrase for s in specials):
        raise PhraseRejected("a phrase must not contain special-token text")


@dataclass(frozen=True, slots=True)
class Phrase:
    text: str
    ids: array[int]


class PhraseTable:
    """The phrases of one tokenizer version, each with the ids the encoder itself gives it."""

    def __init__(
        self, phrases: Iterable[str], encode: Callable[[str], list[int]], specials: Iterable[str]
    ) -> None:
        specials = tuple(specials)
        table: list[Phrase] = []
        for text in dict.fromkeys(phrases):
            check_phrase(text, specials)
            table.append(Phrase(text, array("i", encode(text))))
        self.phrases = tuple(sorted(table, key=lambda p: -len(p.text)))  # longest first wins an overlap

    def spans(self, text: str) -> list[tuple[int, int, Phrase]]:
        """Non-overlapping anchored occurrences, in text order."""
        found: list[tuple[int, int, Phrase]] = []
        taken: list[tuple[int, int]] = []
        for phrase in self.phrases:
            start = text.find(phrase.text)
            while start != -1:
                end = start + len(phrase.text)
                if (
                    is_anchor(text, start)
                    and is_anchor(text, end)
                    and not any(s < end and start < e for s, e in taken)
                ):
                    found.append((start, end, phrase))
                    taken.append((start, end))
                start = text.find(phrase.text, start + 1)
        found.sort(key=lambda f: f[0])
        return found

    def encode(self, text: str, encode: Callable[[str], list[int]]) -> array[int]:
        """Plain `encode(text)`, with the phrases' stored ids spliced in at their anchored occurrences."""
        out = array("i")
        pos = 0
        for start, end, phrase in self.spans(text) if self.phrases else ():
            if start > pos:
                out.extend(encode(text[pos:start]))
            out.extend(phrase.ids)
            pos = end
        if pos < len(text) or not out:
            out.extend(encode(text[pos:]))
        return out
