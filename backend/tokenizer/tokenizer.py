"""The model's tokenizer as a `tiktoken.Encoding`, plus chat templating and an exportable form.

Ranks equal token ids, so `encoding.encode` returns model ids directly. Bytes the vocabulary has no
token for carry placeholder ranks >= `vocab_size`; they are dropped from `encode` output, which is what
llama.cpp does with them (checked by the golden corpus test). `version` hashes everything that changes
token ids (ranks, pattern, special tokens), so a gateway can key caches on it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import tiktoken

from tokenedge_wire.chat_template import ChatTemplate
from tokenedge_wire.tokenizer_version import tokenizer_version

EXPORT_FORMAT = "tokenedge.tiktoken.v1"


class Tokenizer:
    """Encode/decode with model ids; immutable after construction."""

    __slots__ = (
        "_chat_template",
        "_placeholders",
        "bos_token_id",
        "encoding",
        "eos_token_ids",
        "version",
        "vocab_size",
    )

    def __init__(
        self,
        *,
        name: str,
        pattern: str,
        mergeable_ranks: dict[bytes, int],
        special_tokens: dict[str, int],
        vocab_size: int,
        bos_token_id: int | None,
        eos_token_ids: Iterable[int],
        placeholder_ids: Iterable[int] = (),
        chat_template: str | None = None,
    ) -> None:
        self.encoding = tiktoken.Encoding(
            name, pat_str=pattern, mergeable_ranks=mergeable_ranks, special_tokens=special_tokens
        )
        self.vocab_size = vocab_size
        self.bos_token_id = bos_token_id
        self.eos_token_ids = frozenset(eos_token_ids)
        self._placeholders = frozenset(placeholder_ids)
        if any(i >= vocab_size for i in self.eos_token_ids):
            raise ValueError("eos token id outside the vocabulary")
        self.version = tokenizer_version(pattern, mergeable_ranks, special_tokens)
        by_id = {v: k for k, v in special_tokens.items()}
        self._chat_template = (
            None
            if chat_template is None
            else ChatTemplate(
                chat_template,
                bos_token=by_id.get(bos_token_id, "") if bos_token_id is not None else "",
                eos_token=by_id.get(min(self.eos_token_ids), "") if self.eos_token_ids else "",
            )
        )

    @property
    def chat_template(self) -> str | None:
        return None if self._chat_template is None else self._chat_template.source

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        ids = (
            self.encoding.encode(text, allowed_special="all")
            if allow_special
            else self.encoding.encode_ordinary(text)
        )
        if self._placeholders:
            ids = [i for i in ids if i not in self._placeholders]
        return ids

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        self._check_ids(ids)
        return self.encoding.decode_bytes(list(ids))

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        if self._chat_template is None:
            raise ValueError("this model has no chat template")
        return self._chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    def export(self) -> dict[str, Any]:
        """Everything a client needs to rebuild this encoder with `tiktoken.Encoding`."""
        return {
            "format": EXPORT_FORMAT,
            "name": self.encoding.name,
            "version": self.version,
            "pattern": self.encoding._pat_str,
            "mergeable_ranks": {
                base64.b64encode(k).decode("ascii"): v for k, v in self.encoding._mergeable_ranks.items()
            },
            "special_tokens": dict(self.encoding._special_tokens),
            "dropped_ids": sorted(self._placeholders),
            "vocab_size": self.vocab_size,
            "bos_token_id": self.bos_token_id,
            "eos_token_ids": sorted(self.eos_token_ids),
            "chat_template": self.chat_template,
        }

    def _check_ids(self, ids: Sequence[int]) -> None:
        for i in ids:
            if not 0 <= i < self.vocab_size or i in self._placeholders:
                raise ValueError(f"token id {i} is outside the vocabulary")
