"""The two forms of one answer, a stream's chunks and a JSON body, converted by one rule per kind of field.

Pure. `Assembler` merges a stream's chunks into the JSON body (stream -> JSON: a stream-filled entry's JSON hit);
`stream_of` splits a JSON body into chunks (JSON -> stream: a JSON-filled entry's streamed hit). Every field is
kept, known or not; the rule follows where the field sits and what it holds:

- **Top-level members** (`id`, `created`, `model`, `system_fingerprint`, `service_tier`, `usage`, llama.cpp's
  `timings`, anything): a scalar of the answer, whatever its type. Stream -> JSON: the value of the last chunk that
  carries one that is not null (null when every chunk carries null). JSON -> stream: on every chunk, but `usage`
  only on the closing usage chunk. `object` is the form's own (`chat.completion(.chunk)`, `text_completion`).
- **Per-choice members** beside the text (`finish_reason`, vLLM's `stop_reason`, SGLang's `matched_stop`,
  anything): the same rule, per choice, except lists (vLLM's `token_ids`), which concatenate. JSON -> stream: on
  the choice's finish chunk.
- **`logprobs`**: its lists concatenate (`content`, `refusal`; `tokens`, `token_logprobs`, `top_logprobs`,
  `text_offset`), its other members follow the scalar rule. JSON -> stream: whole, on the choice's first text chunk.
- **The text** (a chat `delta` into `message`, a completion's `text`): strings concatenate (`content`,
  `reasoning_content`, `reasoning`, `refusal`, `function_call.name`/`.arguments`,
  `tool_calls[].function.name`/`.arguments`, `audio.data`/`.transcript`, unknown strings); identifiers (`id`,
  `type`, `role`, `index`), numbers and booleans follow the scalar rule; lists of objects that all carry an
  `index` (`tool_calls`) merge item by index (a JSON tool call has none), other lists (`annotations`) concatenate;
  the objects named above (`function_call`, `audio`, a tool call's `function`) merge member by member.
  JSON -> stream: the role delta first (with `content: ""` and every null or empty member, as OpenAI's first
  chunk), then reasoning, content and every other string in pieces, tool calls one per delta with their index,
  every other member whole in a delta of its own. A chat message's `content` of "" is null beside a refusal, a
  tool call or a function call (OpenAI's JSON shape).
- **An object in a delta of unknown rule** (none of the above) is exact when one chunk carries it: the JSON gets
  that value. When two chunks do (or a chunk carries a whole `message`), no rule says how they combine:
  `Assembler.convertible` turns False and the entry serves its own form only (a JSON request misses with
  `Cache-Status: ...; detail=stream-only`).

A member that is null or empty in one form may be absent in the other: a stream carries only what its chunks
carry (OpenAI's JSON shows `annotations: []`, its stream nothing). The identity of a hit is that of the answer
that filled the entry, in both forms: its `id`, `created` (llama.cpp stamps each chunk: the last one's),
`system_fingerprint`, and what measured that run (llama.cpp's `timings`, `usage`'s `cached_tokens`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

CHAT = "chat/completions"
_IDENTIFIERS = frozenset({"id", "type", "role", "index"})
_KNOWN_OBJECTS = frozenset({"function_call", "audio", "function"})
_REASONING = ("reasoning_content", "reasoning")  # streamed before the content, as reasoning models do
_CHOICE_TEXT = frozenset({"index", "delta", "message", "text", "logprobs"})
_CALLS = ("tool_calls", "function_call", "refusal")  # beside these, an empty content is null


class Assembler:
    """Stream -> JSON, one chunk at a time (the recorder feeds it every chunk it records)."""

    def __init__(self, endpoint: str) -> None:
        self.chat = endpoint == CHAT
        self.convertible = True  # False once a member's merge rule is unknown (an object carried twice)
        self.head: dict[str, Any] = {}
        self.choices: dict[int, _Choice] = {}

    def feed(self, doc: Mapping[str, Any]) -> None:
        for name, value in doc.items():
            if name not in ("choices", "object"):
                _scalar(self.head, name, value)
        for raw in doc.get("choices") or ():
            if not isinstance(raw, dict):
                continue
            index = raw.get("index", 0)
            choice = self.choices.setdefault(index if isinstance(index, int) else 0, _Choice())
            self.convertible &= choice.feed(raw, chat=self.chat)

    def body(self) -> dict[str, Any]:
        """The JSON answer: the head's members, this form's `object`, the choices, then `usage` if any."""
        obj = "chat.completion" if self.chat else "text_completion"
        doc: dict[str, Any] = {}
        for name, value in self.head.items():
            if name != "usage":
                doc[name] = value
            if name == "id":
                doc["object"] = obj
        doc.setdefault("object", obj)
        doc["choices"] = [c.body(i, chat=self.chat) for i, c in sorted(self.choices.items())]
        if "usage" in self.head:
            doc["usage"] = self.head["usage"]
        return doc


class _Choice:
    __slots__ = ("logprobs", "members", "message", "text")

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.text: list[str] = []
        self.logprobs: dict[str, Any] | None = None
        self.members: dict[str, Any] = {}  # finish_reason and every other per-choice member

    @property
    def finish_reason(self) -> Any:
        return self.members.get("finish_reason")

    def feed(self, raw: Mapping[str, Any], *, chat: bool) -> bool:
        exact = (
            "message" not in raw
        )  # a chunk carrying a whole message: how it adds to the deltas is not known
        if chat and isinstance(raw.get("delta"), dict):
            exact &= merge_delta(self.message, raw["delta"])
        elif not chat and isinstance(raw.get("text"), str):
            self.text.append(raw["text"])
        if isinstance(raw.get("logprobs"), dict):
            self.logprobs = _concat_lists(self.logprobs, raw["logprobs"])
        for name, value in raw.items():
            if name in _CHOICE_TEXT:
                continue
            held = self.members.get(name)
            if isinstance(value, list) and isinstance(held, list):
                held.extend(value)
            else:
                _scalar(self.members, name, value)
        return exact

    def body(self, index: int, *, chat: bool) -> dict[str, Any]:
        text: dict[str, Any] = {"message": _message(self.message)} if chat else {"text": "".join(self.text)}
        return {
            "index": index,
            **text,
            "logprobs": self.logprobs,
            "finish_reason": self.finish_reason,
            **{k: v for k, v in self.members.items() if k != "finish_reason"},
        }


def _scalar(into: dict[str, Any], name: str, value: Any) -> None:
    """The scalar rule: the last value that is not null; null only while nothing else was carried."""
    if value is not None or name not in into:
        into[name] = value


def merge_delta(acc: dict[str, Any], delta: Mapping[str, Any]) -> bool:
    """Merge one delta (or an object inside one) into `acc` by the text rules; False when one has no rule."""
    exact = True
    for name, value in delta.items():
        held = acc.get(name)
        if value is None or held is None:
            _scalar(acc, name, value)
        elif name in _IDENTIFIERS or isinstance(value, bool | int | float):
            acc[name] = value
        elif isinstance(value, str) and isinstance(held, str):
            acc[name] = held + value
        elif isinstance(value, list) and isinstance(held, list):
            exact &= _merge_list(held, value)
        elif isinstance(value, dict) and isinstance(held, dict) and name in _KNOWN_OBJECTS:
            exact &= merge_delta(held, value)
        else:  # an object of unknown rule carried twice, or a member that changed its kind
            acc[name] = value
            exact = False
    return exact


def _indexed(items: list[Any]) -> bool:
    return all(isinstance(i, dict) and isinstance(i.get("index"), int) for i in items)


def _merge_list(held: list[Any], items: list[Any]) -> bool:
    if not (items and _indexed(items) and _indexed(held)):
        held.extend(items)
        return True
    exact = True
    for item in items:
        slot = next((h for h in held if h["index"] == item["index"]), None)
        if slot is None:
            held.append(item)
        else:
            exact &= merge_delta(slot, item)
    return exact


def _concat_lists(into: dict[str, Any] | None, part: Mapping[str, Any]) -> dict[str, Any]:
    merged = into if into is not None else {}
    for name, value in part.items():
        if isinstance(value, list) and isinstance(merged.get(name), list):
            merged[name].extend(value)
        elif isinstance(value, list):
            merged[name] = list(value)
        else:
            _scalar(merged, name, value)
    return merged


def _message(merged: Mapping[str, Any]) -> dict[str, Any]:
    """The assembled message: role and content first, tool calls in index order without their index."""
    message: dict[str, Any] = {"role": merged.get("role") or "assistant", "content": merged.get("content")}
    for name, value in merged.items():
        if name in ("role", "content"):
            continue
        if name == "tool_calls" and isinstance(value, list) and value and _indexed(value):
            value = [{k: v for k, v in item.items() if k != "index"} for item in sorted(value, key=_index_of)]
        message[name] = value
    if message["content"] == "" and any(message.get(name) for name in _CALLS):
        message["content"] = None
    return message


def _index_of(item: Mapping[str, Any]) -> int:
    return int(item["index"])


# JSON -> stream -------------------------------------------------------------------------------------------------


def stream_of(
    doc: Mapping[str, Any], endpoint: str, *, include_usage: bool, chunk_chars: int
) -> Iterator[dict[str, Any]]:
    """The chunks of a JSON answer, each choice's text in `chunk_chars` pieces (0: one piece), then the usage
    chunk when the request asked for it."""
    chat = endpoint == CHAT
    base = {k: v for k, v in doc.items() if k not in ("choices", "usage")}
    base["object"] = "chat.completion.chunk" if chat else "text_completion"
    for choice in doc.get("choices") or ():
        if isinstance(choice, Mapping):
            yield from _choice_chunks(base, choice, chat, chunk_chars)
    if include_usage and isinstance(doc.get("usage"), Mapping):
        yield {**base, "choices": [], "usage": doc["usage"]}


def _choice_chunks(
    base: Mapping[str, Any], choice: Mapping[str, Any], chat: bool, chunk_chars: int
) -> Iterator[dict[str, Any]]:
    index = choice.get("index", 0)
    parts: list[dict[str, Any]]
    if chat:
        parts = [{"delta": d} for d in _chat_deltas(choice.get("message") or {}, chunk_chars)]
        first_text = 1 if len(parts) > 1 else None  # after the role delta
    else:
        parts = [{"text": piece} for piece in split(choice.get("text") or "", chunk_chars)]
        first_text = 0 if parts else None
    logprobs = choice.get("logprobs")
    for n, part in enumerate(parts):
        lp = logprobs if n == first_text else None
        yield {**base, "choices": [{"index": index, **part, "logprobs": lp, "finish_reason": None}]}
    members = {k: v for k, v in choice.items() if k not in _CHOICE_TEXT}
    closing: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
    lp = logprobs if first_text is None else None
    yield {**base, "choices": [{"index": index, **closing, "logprobs": lp, **members}]}


def _chat_deltas(message: Mapping[str, Any], chunk_chars: int) -> list[dict[str, Any]]:
    content = message.get("content")
    first: dict[str, Any] = {"role": message.get("role") or "assistant"}
    if content is None or isinstance(content, str):
        first["content"] = "" if isinstance(content, str) else None
    rest: list[dict[str, Any]] = []
    order = [n for n in _REASONING if n in message] + [n for n in message if n not in _REASONING]
    for name in order:
        value = message[name]
        if name == "role" or (name == "content" and "content" in first and not value):
            continue
        if value is None or value == [] or value == "" or value == {}:
            first[name] = value
        elif isinstance(value, str) and name not in _IDENTIFIERS:
            rest += [{name: piece} for piece in split(value, chunk_chars)]
        elif name == "tool_calls" and isinstance(value, list) and all(isinstance(c, dict) for c in value):
            rest += [{name: [{"index": i, **call}]} for i, call in enumerate(value)]
        else:
            rest.append({name: value})
    return [first, *rest]


def split(text: str, chunk_chars: int) -> list[str]:
    """`text` in pieces of `chunk_chars` code points; 0 means one piece; nothing for an empty text."""
    if not text:
        return []
    if chunk_chars <= 0:
        return [text]
    return [text[i : i + chunk_chars] for i in range(0, len(text), chunk_chars)]
