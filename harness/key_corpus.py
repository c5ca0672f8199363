"""The committed key corpus (harness/data/key_corpus.json): request variants in groups, for the key levels.

Each group holds variants of one request that differ only in one way (whitespace at the ends or inside, CRLF, NFC
vs NFD, zero-width characters, content as a string, one part or several parts, SmolLM2's default system prompt
spelled out or left to the template, key order, defaults spelled out, tools and response_format orderings). Some
variants reach the model as the same token ids, others do not: the tests decide which by asking the backend's own
tokenizer, never by trusting this file. Regenerate with `python -m harness.key_corpus` (deterministic).
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

PATH = Path(__file__).parent / "data" / "key_corpus.json"
MAX_TOKENS = 24
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = [
    "What is the capital of France?",
    "Name a color.",
    "Write a haiku about the sea.",
    "Is a tomato a fruit? Answer briefly.",
    "Translate 'good morning' into French.",
]
PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time", "The café on the corner"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    },
]
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}


def chat(content: Any, *, system: str | None = None, **fields: Any) -> dict[str, Any]:
    messages = [] if system is None else [{"role": "system", "content": system}]
    return {
        "model": "SmolLM2-135M-Instruct",
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "messages": [*messages, {"role": "user", "content": content}],
        **fields,
    }


def completion(prompt: Any, **fields: Any) -> dict[str, Any]:
    return {
        "model": "SmolLM2-135M-Instruct",
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "prompt": prompt,
        **fields,
    }


def parts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": t} for t in texts]


def reordered(value: Any) -> Any:
    """The same JSON with every object's keys in reverse order."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


def question_groups(i: int, q: str) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """Question `i`'s chat groups: group name -> (endpoint, variants), in the corpus file's order."""
    groups = {**spelling_variants(q), **shape_variants(q), **field_variants(q)}
    return {f"chat-{name}-{i}": ("chat/completions", variants) for name, variants in groups.items()}


def spelling_variants(q: str) -> dict[str, list[dict[str, Any]]]:
    """The question's text spelled differently: whitespace at the ends or inside, line endings, NFC vs NFD,
    zero-width characters."""
    nfd_q = unicodedata.normalize("NFD", q.replace("France", "Fran\u00e7e").replace("color", "col\u00f6r"))
    return {
        "ends": [
            chat(q),
            chat(q + " "),
            chat(" " + q),
            chat(q + "\n"),
            chat("\n" + q + "\n"),
            chat(q + "  "),
        ],
        "inside": [
            chat(q),
            chat(q.replace(" ", "  ", 1)),
            chat(q.replace(" ", "\t", 1)),
            chat(q.replace(" ", "\n", 1)),
        ],
        "crlf": [chat(f"{q}\nBe brief."), chat(f"{q}\r\nBe brief."), chat(f"{q}\rBe brief.")],
        "unicode": [chat(unicodedata.normalize("NFC", nfd_q)), chat(nfd_q)],
        "zero-width": [
            chat(q),
            chat(q.replace(" ", " \u200b", 1)),
            chat("\ufeff" + q),
            chat(q.replace(" ", "\u2060 ", 1)),
        ],
    }


def shape_variants(q: str) -> dict[str, list[dict[str, Any]]]:
    """The same text in another message shape: content parts, a system prompt, key order."""
    words = q.split(" ")
    return {
        "parts": [
            chat(q),
            chat(parts(q)),
            chat(parts(words[0] + " ", " ".join(words[1:]))),
            chat(parts(words[0], " " + " ".join(words[1:]))),
            chat(parts(*[w + " " for w in words[:-1]], words[-1])),
            chat(parts(words[0], " ".join(words[1:]))),
        ],
        "system": [
            chat(q),
            chat(q, system=SMOLLM_SYSTEM),
            chat(q, system=SMOLLM_SYSTEM + " "),
            chat(q, system="You are a helpful assistant."),
        ],
        "order": [
            chat(q),
            reordered(chat(q)),
            {
                "messages": [{"content": q, "role": "user"}],
                "max_tokens": MAX_TOKENS,
                "model": "SmolLM2-135M-Instruct",
                "temperature": 0,
            },
        ],
    }


def field_variants(q: str) -> dict[str, list[dict[str, Any]]]:
    """The same messages with parameters at their defaults spelled out, or tools and schemas reordered."""
    return {
        "defaults": [
            chat(q),
            chat(q, temperature=0.0),
            chat(q, top_p=1, n=1),
            chat(q, presence_penalty=0, frequency_penalty=0.0),
            chat(q, stop=None, logit_bias={}),
            {**chat(q), "max_tokens": None, "max_completion_tokens": MAX_TOKENS},
            chat(q, stream=False, user="someone"),
            chat(q, logprobs=False),
            chat(q, stop=[]),
            chat(q, response_format={"type": "text"}),
            chat(q, seed=None),
        ],
        "tools": [
            chat(q, tools=TOOLS),
            chat(q, tools=reordered(TOOLS)),
            chat(q, tools=TOOLS, tool_choice="auto"),
            chat(q, tools=TOOLS[::-1]),
            chat(q, response_format=SCHEMA),
            chat(q, response_format=reordered(SCHEMA)),
        ],
    }


def prompt_groups(i: int, p: str) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """Prompt `i`'s completion groups, as `question_groups`."""
    groups = {
        "ends": [
            completion(p),
            completion(p + " "),
            completion(p + "\n"),
            completion(" " + p),
            completion(p + "\n    "),
            completion([p]),
        ],
        "inside": [
            completion(p),
            completion(p.replace(" ", "  ", 1)),
            completion(p.replace(" ", "\r\n", 1)),
            completion(p.replace(" ", "\n", 1)),
        ],
        "unicode": [
            completion(unicodedata.normalize("NFC", p)),
            completion(unicodedata.normalize("NFD", p)),
            completion(p.replace(" ", "\u200b ", 1)),
        ],
        "defaults": [
            completion(p),
            reordered(completion(p)),
            completion(p, temperature=0.0, echo=False, best_of=1, n=1),
            completion(p, stop=None, logprobs=None, stream=False, user="u"),
        ],
    }
    return {f"prompt-{name}-{i}": ("completions", variants) for name, variants in groups.items()}


def build() -> dict[str, Any]:
    groups: dict[str, Any] = {}
    for i, q in enumerate(QUESTIONS):
        groups.update(
            {name: {"endpoint": e, "variants": v} for name, (e, v) in question_groups(i, q).items()}
        )
    for i, p in enumerate(PROMPTS):
        groups.update({name: {"endpoint": e, "variants": v} for name, (e, v) in prompt_groups(i, p).items()})
    return {"format": "tokenedge.key-corpus.v1", "max_tokens": MAX_TOKENS, "groups": groups}


def load() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(PATH.read_text(encoding="utf-8"))
    return doc


if __name__ == "__main__":
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(json.dumps(build(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    corpus = build()
    print(
        f"{PATH}: {len(corpus['groups'])} groups, "
        f"{sum(len(g['variants']) for g in corpus['groups'].values())} variants"
    )
