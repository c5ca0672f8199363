"""The `tokens` key level: a hit must be the answer the model would give, so the key is what the model sees.

Pure properties of gateway/tokens/keyform.py with gateway/keys/derive.py, the backend's own tokenizer as the oracle for
the ids. The same level through a real gateway in front of the backend app: test_keys_tokens_gateway.py.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.keys.canonical import Level, canonicalize
from gateway.keys.derive import derive_key
from gateway.tokens.cache import TokenCache
from gateway.tokens.encoder import ModelEncoder
from gateway.tokens.keyform import canonical_form, model_input
from gateway.tokens.registry import spec_from_export
from tests.support.token_backend import chatml_byte_tokenizer, joined, oracle_ids

CHAT = "chat/completions"
# Like SmolLM2's: a default system prompt when none is given, and (unlike SmolLM2's) contents trimmed.
TRIMMING = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOKENIZER = chatml_byte_tokenizer(TRIMMING)
ENCODER = ModelEncoder(spec_from_export(TOKENIZER.export()), TokenCache(1 << 20))


def params(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    field = "messages" if endpoint == CHAT else "prompt"
    return {k: v for k, v in canonicalize(endpoint, body, Level.EXACT).items() if k != field}


def tokens_key(endpoint: str, body: dict[str, Any], encoder: ModelEncoder = ENCODER) -> str:
    level, form = canonical_form("auto", endpoint, body, encoder)
    assert level is Level.TOKENS
    return derive_key(scope="pub", endpoint=endpoint, level=level, model_revision="r", canonical=form).key


# --- the property ---------------------------------------------------------------------------------------

PIECES = st.sampled_from(
    [
        "Name a",
        " ",
        "color.",
        "  ",
        "\n",
        "\r\n",
        "\t",
        "caf\u00e9",
        "cafe\u0301",
        "\u200b",
        "Sure,",
        "x",
        "<|im_end|>",
        "2+2",
        "\u00a0",
    ]
)
TEXT = st.lists(PIECES, max_size=6).map("".join)


@st.composite
def contents(draw: st.DrawFn, text: str | None = None) -> Any:
    """`text` as a string, one part, or several parts split anywhere (all join to the same text)."""
    text = draw(TEXT) if text is None else text
    shape = draw(st.sampled_from(["string", "one", "split"]))
    if shape == "string":
        return text
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=3))) if shape == "split" else []
    bounds = [0, *cuts, len(text)]
    return [{"type": "text", "text": text[a:b]} for a, b in itertools.pairwise(bounds)]


@st.composite
def chats(draw: st.DrawFn) -> dict[str, Any]:
    roles = draw(st.lists(st.sampled_from(["system", "user", "assistant"]), min_size=1, max_size=3))
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": r, "content": draw(contents())} for r in roles],
    }
    for name, values in (
        ("temperature", [0, 0.0, 0.5]),
        ("max_tokens", [5, 5.0, 6]),
        ("stop", ["x", ["x"]]),
        ("top_p", [1, 0.9]),
        ("user", ["u"]),
        ("guided", [None, {"b": 1, "a": 2}]),
    ):
        if draw(st.booleans()):
            body[name] = draw(st.sampled_from(values))
    return body


@st.composite
def variant(draw: st.DrawFn, body: dict[str, Any]) -> dict[str, Any]:
    """A request near `body`: its text re-split into parts, trimmed or padded, the default system prompt
    spelled out, a parameter changed, keys reordered, or an unrelated request."""
    how = draw(st.sampled_from(["resplit", "pad", "system", "param", "reorder", "other"]))
    if how == "other":
        return draw(chats())
    out = {**body, "messages": list(body["messages"])}
    i = draw(st.integers(0, len(out["messages"]) - 1))
    text = joined([out["messages"][i]])[0]["content"]
    if how == "resplit":
        out["messages"][i] = {**out["messages"][i], "content": draw(contents(text))}
    elif how == "pad":
        out["messages"][i] = {
            **out["messages"][i],
            "content": draw(st.sampled_from([" ", "\n", ""]))
            + text
            + draw(st.sampled_from([" ", "\n", "\u200b", ""])),
        }
    elif how == "system":
        out["messages"].insert(0, {"role": "system", "content": "You are helpful."})
    elif how == "param":
        out[draw(st.sampled_from(["temperature", "max_tokens", "seed"]))] = draw(st.sampled_from([0, 1, 7.0]))
    else:
        out = dict(reversed(list(out.items())))
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_tokens_keys_are_equal_iff_the_model_sees_the_same_ids_and_parameters(data: st.DataObject) -> None:
    a = data.draw(chats())
    b = data.draw(variant(a))
    same_input = (oracle_ids(TOKENIZER, CHAT, a), params(CHAT, a)) == (
        oracle_ids(TOKENIZER, CHAT, b),
        params(CHAT, b),
    )
    assert (tokens_key(CHAT, a) == tokens_key(CHAT, b)) == same_input


@settings(max_examples=200, deadline=None)
@given(a=TEXT, b=TEXT, max_a=st.sampled_from([3, 3.0, 4]), max_b=st.sampled_from([3, 4]))
def test_completion_keys_are_equal_iff_the_prompt_ids_and_parameters_are(
    a: str, b: str, max_a: Any, max_b: Any
) -> None:
    body_a = {"model": "tiny", "prompt": a, "max_tokens": max_a, "temperature": 0}
    body_b = {"model": "tiny", "prompt": [b], "max_tokens": max_b, "temperature": 0}  # a one-prompt batch
    same_input = (TOKENIZER.encode(a), params("completions", body_a)) == (
        TOKENIZER.encode(b),
        {**params("completions", body_b)},
    )
    assert (tokens_key("completions", body_a) == tokens_key("completions", body_b)) == same_input


def test_what_the_template_normalizes_collapses_and_nothing_else() -> None:
    base = {"model": "tiny", "temperature": 0, "messages": [{"role": "user", "content": "Name a color."}]}
    system = {**base, "messages": [{"role": "system", "content": "You are helpful."}, *base["messages"]]}
    padded = {**base, "messages": [{"role": "user", "content": "  Name a color.\n"}]}  # TRIMMING trims
    parts = {
        **base,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "color."}],
            }
        ],
    }
    glued = {
        **base,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Name a"}, {"type": "text", "text": "color."}],
            }
        ],
    }
    assert (
        tokens_key(CHAT, base)
        == tokens_key(CHAT, system)
        == tokens_key(CHAT, padded)
        == tokens_key(CHAT, parts)
    )
    assert tokens_key(CHAT, glued) != tokens_key(CHAT, base)
    plain = ModelEncoder(spec_from_export(chatml_byte_tokenizer().export()), TokenCache(1 << 20))  # no trim
    assert tokens_key(CHAT, padded, plain) != tokens_key(CHAT, base, plain)
    assert tokens_key(CHAT, system, plain) != tokens_key(CHAT, base, plain)


def test_model_input_shapes_follow_the_backend_and_fall_back_when_unknown() -> None:
    hi = list(TOKENIZER.encode("hi"))
    assert model_input(ENCODER, "completions", {"prompt": "hi"}) == hi
    assert model_input(ENCODER, "completions", {"prompt": ["hi"]}) == hi
    assert model_input(ENCODER, "completions", {"prompt": hi}) == hi
    assert model_input(ENCODER, "completions", {"prompt": ["a", "b"]}) is None  # the backend refuses batches
    assert model_input(ENCODER, "embeddings", {"input": "hi"}) == hi
    assert model_input(ENCODER, "embeddings", {"input": ["hi", [7]]}) == [hi, [7]]
    assert (
        model_input(ENCODER, CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
        is None
    )
    level, form = canonical_form(
        "auto",
        CHAT,
        {
            "model": "t",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        },
        ENCODER,
    )
    assert level is Level.EXACT and form["messages"][0]["content"][0]["type"] == "image_url"
    assert canonical_form("normalized", "completions", {"prompt": " a"}, ENCODER) == (
        Level.NORMALIZED,
        {"prompt": "a"},
    )
