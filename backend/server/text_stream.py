"""Incremental detokenization with stop strings: token ids in, text that is safe to send out.

Pure state, no I/O. Byte-level tokens can split a UTF-8 character, so bytes go through an incremental
decoder; text that could still be the start of a stop string is held back until it cannot be. A stop
string found ends the stream with the text before it (OpenAI semantics: the stop string is not sent).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    stopped: bool  # a stop string matched: the caller must end the request


class TextStream:
    def __init__(self, decode_bytes: Callable[[Sequence[int]], bytes], stop: Sequence[str] = ()) -> None:
        self._decode_bytes = decode_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(stop)
        self._text = ""
        self._sent = 0
        self._done = False

    @property
    def text(self) -> str:
        """Everything sent so far."""
        return self._text[: self._sent]

    def push(self, token_ids: Sequence[int]) -> TextDelta:
        assert not self._done, "push after the stream ended"
        self._text += self._decoder.decode(self._decode_bytes(token_ids))
        return self._advance(final=False)

    def finish(self) -> TextDelta:
        """Flush held-back text (the generation ended without a stop string)."""
        if self._done:
            return TextDelta("", stopped=True)
        self._text += self._decoder.decode(b"", final=True)
        return self._advance(final=True)

    def _advance(self, final: bool) -> TextDelta:
        start = self._sent
        hit = self._find_stop(start)
        if hit is not None:
            self._done = True
            self._sent = hit
            return TextDelta(self._text[start:hit], stopped=True)
        end = len(self._text) if final else len(self._text) - self._held_back()
        end = max(end, start)
        self._sent = end
        if final:
            self._done = True
        return TextDelta(self._text[start:end], stopped=False)

    def _find_stop(self, sent: int) -> int | None:
        if not self._stop:
            return None
        longest = max(len(s) for s in self._stop)
        window_start = max(0, sent - longest + 1)
        found = [i for s in self._stop if (i := self._text.find(s, window_start)) != -1]
        return max(min(found), sent) if found else None

    def _held_back(self) -> int:
        """Length of the longest unsent suffix that is a proper prefix of a stop string."""
        tail = self._text[self._sent :]
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(tail)), best, -1):
                if s.startswith(tail[-n:]):
                    best = n
                    break
        return best
