"""What a third-party engine's tokenize routes must show before their ids may key requests (pure, no I/O).

An engine that answers `POST /tokenize` (vLLM, SGLang) or `POST /apply-template` + `POST /tokenize` (llama.cpp's
`llama-server`) could still be unfit: a route that tokenizes the JSON instead of rendering the chat template, one
that ignores the text, or one that is not stable. So a small fixed set of requests is asked once per
(upstream, model, revision), and its ids must be: id arrays at all, stable when asked twice, equal for a message
and its one-text-part twin (the engine parsed the messages, as its chat route does), and distinct where the words
differ (another word, a system message). Spelling the model's own template folds (a template that trims content)
is not a difference to demand: those requests do reach the model as the same ids. (The twin check also refuses a
template that renders a list of parts unlike a string: over-cautious there, and keyed `exact`.) Only then does
`auto` use the `tokens` level; otherwise the verdict names the reason, which explain shows and
`tokenedge_key_level_fallbacks_total{reason}` counts.
The verdict's identity hashes every probe's ids, so another tokenizer or template behind the same name and
revision gets other keys as soon as it is probed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from gateway.keys.canonical import Fallback

# The chat probes: (name, messages). "hello" is asked twice (stability).
CHAT_PROBES: Final[tuple[tuple[str, list[dict[str, Any]]], ...]] = (
    ("hello", [{"role": "user", "content": "Hello"}]),
    ("hello_part", [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]),
    ("goodbye", [{"role": "user", "content": "Goodbye"}]),
    ("system", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]),
    ("hello_again", [{"role": "user", "content": "Hello"}]),
)
PROMPT_PROBES: Final[tuple[tuple[str, str], ...]] = (
    ("hello", "Hello"),
    ("goodbye", "Goodbye"),
    ("hello_again", "Hello"),
)


@dataclass(frozen=True, slots=True)
class Verified:
    kind: str  # "vllm" (also SGLang's prompt route) or "llamacpp"
    identity: str  # goes into the key beside the ids


@dataclass(frozen=True, slots=True)
class Refused:
    reason: Fallback
    detail: str


def is_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    )


def judge(kind: str, endpoint: str, results: Mapping[str, Any]) -> Verified | Refused:
    """The verdict on one kind's probe answers (`results`: probe name -> the ids it answered, or anything else)."""
    names = [name for name, _ in (CHAT_PROBES if endpoint == "chat" else PROMPT_PROBES)]
    for name in names:
        if not is_ids(results.get(name)):
            return Refused(Fallback.PROBE_FAILED, f"{kind}: probe {name!r} answered no token ids")
    ids: dict[str, Sequence[int]] = {name: results[name] for name in names}
    if ids["hello"] != ids["hello_again"]:
        return Refused(Fallback.PROBE_INCONSISTENT, f"{kind}: the same request gave other ids")
    if ids["hello"] == ids["goodbye"]:
        return Refused(Fallback.PROBE_INCONSISTENT, f"{kind}: other words gave the same ids")
    if endpoint == "chat":
        if ids["hello"] != ids["hello_part"]:
            return Refused(Fallback.PROBE_INCONSISTENT, f"{kind}: a one-text-part twin gave other ids")
        if ids["system"] == ids["hello"]:
            return Refused(Fallback.PROBE_INCONSISTENT, f"{kind}: a system message changed no id")
    material = orjson.dumps({"kind": kind, "endpoint": endpoint, "ids": ids}, option=orjson.OPT_SORT_KEYS)
    return Verified(kind, f"remote-{kind}-{hashlib.blake2b(material, digest_size=8).hexdigest()}")
