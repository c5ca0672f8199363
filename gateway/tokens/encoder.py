"""One model's encoder with the request-level cache and phrase splicing in front of tiktoken.

`encode(text)` equals the backend's `Tokenizer.encode(text)` (special-token text becomes the special token,
ids the model has no token for are dropped). Special tokens always split a tiktoken encode, so a text is
encoded as its special-free segments plus the special ids; a chat is rendered with the model's template and
its segments (one per message, between `<|im_start|>`/`<|im_end|>`-style specials) are cached one by one,
so a system prompt shared by many conversations is encoded once.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.tokens.cache import TokenCache
from gateway.tokens.registry import TokenizerSpec
from gateway.tokens.splice import SPLICE_SAFE_PATTERNS, PhraseRejected, PhraseTable, check_phrase


class Unrenderable(ValueError):
    """A chat the gateway cannot render exactly as the backend would (the request goes as JSON, uncounted)."""


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as the backend's protocol hands them to the template (content parts joined)."""
    if not isinstance(messages, list) or not messages:
        raise Unrenderable("messages must be a non-empty array")
    out = []
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise Unrenderable("a message without a role")
        if message.get("tool_calls") or message.get("function_call"):
            # the backend writes an assistant's calls into its content (backend/server/tools.py): ids from the
            # template alone would miss them, and two different calls would share a key
            raise Unrenderable("tool calls in the history")
        content = message.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            if not all(
                isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in content
            ):
                raise Unrenderable("non-text content parts")
            content = "".join(p["text"] for p in content)
        elif not isinstance(content, str):
            raise Unrenderable("content must be a string or text parts")
        out.append({**message, "content": content})
    return out


def _accepted(phrase: str, specials: Sequence[str]) -> bool:
    """A configured phrase this encoder can splice exactly; the others are skipped (plain encode covers them)."""
    try:
        check_phrase(phrase, specials)
    except PhraseRejected:
        return False
    return True


class ModelEncoder:
    def __init__(self, spec: TokenizerSpec, cache: TokenCache, phrases: Iterable[str] = ()) -> None:
        self.spec = spec
        self.version = spec.version
        self._cache = cache
        self._table = cache.table(spec.version)
        self._encoding = spec.encoding
        self._specials: dict[str, int] = dict(spec.encoding._special_tokens)
        names = sorted(self._specials, key=len, reverse=True)
        self._special_re = re.compile("|".join(map(re.escape, names))) if names else None
        self._special_starts = frozenset(name[0] for name in names)
        self._phrases: PhraseTable | None = None
        phrases = tuple(phrases)
        if phrases and spec.encoding._pat_str in SPLICE_SAFE_PATTERNS:
            self._phrases = PhraseTable([p for p in phrases if _accepted(p, names)], self._plain, names)
        self._template: Any = None
        self._last_chat: tuple[Any, array[int]] | None = None  # encode_chat's last (messages, ids)
        if spec.chat_template:
            try:
                from tokenedge_wire.chat_template import ChatTemplate  # jinja2: only where templates exist
            except ImportError:
                pass
            else:
                self._template = ChatTemplate(
                    spec.chat_template, bos_token=spec.bos_token, eos_token=spec.eos_token
                )

    @property
    def splicing(self) -> bool:
        return self._phrases is not None and bool(self._phrases.phrases)

    def _plain(self, text: str) -> list[int]:
        ids = self._encoding.encode_ordinary(text)
        dropped = self.spec.dropped_ids
        if dropped and not dropped.isdisjoint(ids):
            ids = [i for i in ids if i not in dropped]
        return ids

    def _ordinary(self, text: str) -> array[int]:
        """A special-free segment: phrase-spliced when phrases are configured, else one tiktoken call."""
        if self._phrases is not None:
            return self._phrases.encode(text, self._plain)
        return array("i", self._plain(text))

    def _may_hold_specials(self, text: str) -> bool:
        return self._special_re is not None and any(c in text for c in self._special_starts)

    def encode_uncached(self, text: str) -> array[int]:
        if not self._may_hold_specials(text):  # the common case: no special's first character occurs at all
            return self._ordinary(text)
        out = array("i")
        pos = 0
        for match in self._special_re.finditer(text) if self._special_re is not None else ():
            if match.start() > pos:
                out.extend(self._ordinary(text[pos : match.start()]))
            out.append(self._specials[match.group()])
            pos = match.end()
        if pos < len(text):
            out.extend(self._ordinary(text[pos:]))
        return out

    def encode(self, text: str) -> array[int]:
        entry = self._table.get(text)  # TokenCache.get inlined: the hit is one dict lookup and one flag store
        if entry is not None:
            entry[2] = True
            return entry[1]
        self._cache.misses += 1
        ids = self.encode_uncached(text)
        self._cache.put(self.version, text, ids)
        return ids

    def render_chat(self, messages: Any) -> str:
        if self._template is None:
            raise Unrenderable("this model's chat template is not known to the gateway")
        try:
            return str(self._template.render(chat_messages(messages), add_generation_prompt=True))
        except ValueError as exc:  # ChatTemplateError: the backend answers it with its own 400
            raise Unrenderable(str(exc)) from None

    def encode_chat(self, messages: Sequence[Any]) -> array[int]:
        """Template, then one cached encode per special-free segment (each message's text).

        A miss asks twice for the same request's ids (its `tokens`-level key, then the token path's count and
        binary transport), with the same parsed `messages` object: the last one is remembered by identity (the slot
        holds the object, so its id cannot be reused; parsed bodies are never mutated). Like `encode`'s, the
        returned array is shared: read it, never change it."""
        last = self._last_chat
        if last is not None and last[0] is messages:
            return last[1]
        text = self.render_chat(messages)
        out = array("i")
        pos = 0
        for match in self._special_re.finditer(text) if self._special_re is not None else ():
            if match.start() > pos:
                out.extend(self._segment(text[pos : match.start()]))
            out.append(self._specials[match.group()])
            pos = match.end()
        if pos < len(text):
            out.extend(self._segment(text[pos:]))
        self._last_chat = (messages, out)
        return out

    def _segment(self, text: str) -> array[int]:
        """`encode` for a text known to hold no special token (a piece of a rendered chat)."""
        entry = self._table.get(text)
        if entry is not None:
            entry[2] = True
            return entry[1]
        self._cache.misses += 1
        ids = self._ordinary(text)
        self._cache.put(self.version, text, ids)
        return ids

    def count_chat_estimate(self, messages: Any) -> int:
        """OpenAI chat models (no template here): content tokens + 3 per message + 3 priming (cookbook rule)."""
        total = 3
        for message in chat_messages(messages):
            total += 3 + len(self.encode(message["content"])) + len(self.encode(message["role"]))
        return total
