"""Prefix affinity: a request's prompt as a chain of block hashes, and a bounded table chain-hash -> backend.

A backend's prefix cache (the tokenedge engine's chained block hash, vLLM's, SGLang's radix tree) reuses work
only for an identical prefix, so the router hashes the prompt the same way: fixed-size blocks, each hash chained on
the previous one, so block i's hash names the whole prefix up to it. The table remembers which backend was last
sent each chain hash; the longest match names the backend most likely to hold the request's prefix (the anchor:
the SGLang router's per-worker prefix tree, here flattened to a hash table). Only whole blocks are hashed, as an
engine caches only whole blocks. Text blocks are hashed with BLAKE2b (8 bytes) and token-id blocks with Python's
hash of an int tuple, both the same in every process, so the placement one worker or replica learns can be shared
with the others (`share`, by chain hash). A tenant's engine salt (`cache_salt`, gateway/upstream/routing/salt.py) seeds the chain, so one tenant's prefix
never matches another's, as in the engine.

Each entry also keeps every backend that was sent the prefix (a bit mask): the cost policy weighs each
candidate's own matched depth, and an ejected backend is forgotten (`forget`), since it may come back empty.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_TEXT_PERSON = b"te-text-chain"  # text chains and token chains never share a hash by construction
_IDS_SEED = 0x69647300


def _seed(person: bytes, salt: str) -> bytes:
    return hashlib.blake2b(salt.encode("utf-8", "surrogatepass"), digest_size=8, person=person).digest()


def text_chain(text: str, block_chars: int, salt: str = "") -> list[int]:
    """Chained hashes of every whole `block_chars` block of `text` (seeded by the tenant's engine salt); the same
    in every process (about 1 us a block)."""
    out: list[int] = []
    h, blake, to_int = _seed(_TEXT_PERSON, salt), hashlib.blake2b, int.from_bytes
    for start in range(0, len(text) - block_chars + 1, block_chars):
        h = blake(
            h + text[start : start + block_chars].encode("utf-8", "surrogatepass"), digest_size=8
        ).digest()
        out.append(to_int(h, "little"))
    return out


def ids_chain(ids: Sequence[int], block_tokens: int, salt: str = "") -> list[int]:
    """Chained hashes of every whole `block_tokens` block of token ids (the binary token path). A tuple of ints
    hashes the same in every process; the salt (a string, whose `hash` does not) enters through BLAKE2b."""
    out: list[int] = []
    h = hash((_IDS_SEED, int.from_bytes(_seed(b"te-ids-chain", salt), "little"))) if salt else _IDS_SEED
    for start in range(0, len(ids) - block_tokens + 1, block_tokens):
        h = hash((h, tuple(ids[start : start + block_tokens])))
        out.append(h)
    return out


def checkpoints(blocks: int) -> list[int]:
    """The chain depths (1-based) shared with other processes: every one below 16, then 8 per doubling (a match
    found through them is at most 1/8 shallower than the real one), so a chain of n blocks has about
    15 + 8 log2(n / 16) of them: bounded reads and writes for any prompt length."""
    return [d for d in range(1, blocks + 1) if d < 16 or d % (1 << (d.bit_length() - 4)) == 0]


def prompt_text(body: Mapping[str, Any]) -> str | None:
    """The prompt as one string, in a fixed rendering of the messages (role and content, separated by control
    characters no template emits), or the completions prompt; None when there is none."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return "".join(_message_text(m) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: their texts in order (images etc. count as a marker)
        content = "\x1d".join(p.get("text", "\x1c") if isinstance(p, dict) else "\x1c" for p in content)
    return f"{message.get('role', '')}\x1f{content if isinstance(content, str) else ''}\x1e"


@dataclass(frozen=True, slots=True)
class Match:
    backend: int | None = None
    depth: int = 0  # matched blocks
    extends: bool = False  # the match ends where a recorded prompt ended: this request continues it


NO_MATCH = Match()


class AffinityTable:
    """Chain hash -> (the backend last sent that prefix, whether a prompt ended there, every backend sent it as a
    bit mask); least recently used entries are dropped past `max_blocks`.

    The end mark tells a continuation (the next turn of a conversation: its prompt extends the last one whole)
    from a branch (a new prompt that shares only a prefix, such as a common system prompt): the router holds on
    to a continuation harder than to a shared prefix, whose blocks any backend will soon hold anyway."""

    def __init__(self, max_blocks: int) -> None:
        self._max = max_blocks
        self._owner: OrderedDict[int, tuple[int, bool, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def match(self, chain: Sequence[int], allowed: Iterable[int]) -> Match:
        """The longest prefix of `chain` last sent to one of `allowed`."""
        allowed_set = set(allowed)
        owner = self._owner
        for depth in range(len(chain), 0, -1):  # longest first: the deepest known block wins
            found = owner.get(chain[depth - 1])
            if found is not None and found[0] in allowed_set:
                return Match(found[0], depth, found[1])
        return NO_MATCH

    def depths(self, chain: Sequence[int], allowed: Iterable[int]) -> dict[int, int]:
        """Each of `allowed` -> the most blocks of `chain` it was sent (0: none)."""
        left = {b: 1 << b for b in allowed}
        out = dict.fromkeys(left, 0)
        owner = self._owner
        for depth in range(len(chain), 0, -1):
            if not left:
                break
            found = owner.get(chain[depth - 1])
            if found is None:
                continue
            for b in [b for b, bit in left.items() if found[2] & bit]:
                out[b] = depth
                del left[b]
        return out

    def record(self, chain: Sequence[int], backend: int, *, ends: bool = True) -> None:
        """`backend` was sent `chain` (`ends`: a prompt ended at its last block; False for what another process
        reports, which says where a prefix went, not where a prompt ended)."""
        owner = self._owner
        last, bit = len(chain) - 1 if ends else -1, 1 << backend
        for i, h in enumerate(chain):
            before = owner.get(h)
            owner[h] = (backend, i == last, (before[2] if before else 0) | bit)
            owner.move_to_end(h)
        while len(owner) > self._max:
            owner.popitem(last=False)

    def forget(self, backend: int) -> None:
        """`backend` holds none of its prefixes any more (ejected: it may come back empty). O(table) once per
        ejection; an entry it owned passes to another holder, or goes."""
        bit, owner = 1 << backend, self._owner
        for h, (last, ends, mask) in list(owner.items()):
            if not mask & bit:
                continue
            rest = mask & ~bit
            if not rest:
                del owner[h]
            else:
                owner[h] = (last if last != backend else (rest & -rest).bit_length() - 1, ends, rest)
