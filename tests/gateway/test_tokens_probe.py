"""The probe verdict (gateway/tokens/probe.py) and which requests may be keyed on remote ids
(gateway/tokens/remote.py `remote_input`): pure, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.keys.canonical import Fallback
from gateway.tokens.probe import Refused, Verified, judge
from gateway.tokens.remote import remote_input

GOOD_CHAT = {
    "hello": [1, 2],
    "hello_part": [1, 2],
    "goodbye": [1, 3],
    "system": [4, 1, 2],
    "hello_again": [1, 2],
}
GOOD_PROMPT = {"hello": [9], "goodbye": [9, 10], "hello_again": [9]}


def test_consistent_chat_probes_verify() -> None:
    verdict = judge("vllm", "chat", GOOD_CHAT)
    assert isinstance(verdict, Verified) and verdict.identity.startswith("remote-vllm-")


def test_the_identity_follows_the_ids() -> None:
    other = {**GOOD_CHAT, "system": [5, 1, 2]}
    first, second = judge("vllm", "chat", GOOD_CHAT), judge("vllm", "chat", other)
    assert isinstance(first, Verified) and isinstance(second, Verified)
    assert first.identity != second.identity
    assert judge("llamacpp", "chat", GOOD_CHAT) != first


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"hello_again": [1, 5]}, Fallback.PROBE_INCONSISTENT),  # unstable
        ({"goodbye": [1, 2]}, Fallback.PROBE_INCONSISTENT),  # ignores the text
        ({"hello_part": [7]}, Fallback.PROBE_INCONSISTENT),  # tokenized the JSON, not the messages
        ({"system": [1, 2]}, Fallback.PROBE_INCONSISTENT),  # the system message changed nothing
        ({"hello": []}, Fallback.PROBE_FAILED),
        ({"hello": None}, Fallback.PROBE_FAILED),
        ({"hello": [1, -2]}, Fallback.PROBE_FAILED),
        ({"hello": [1, True]}, Fallback.PROBE_FAILED),
    ],
)
def test_unfit_chat_probes_are_refused(change: dict[str, Any], reason: Fallback) -> None:
    verdict = judge("vllm", "chat", {**GOOD_CHAT, **change})
    assert isinstance(verdict, Refused) and verdict.reason is reason


def test_prompt_probes_need_stable_distinct_ids() -> None:
    assert isinstance(judge("vllm", "prompt", GOOD_PROMPT), Verified)
    same = judge("vllm", "prompt", {**GOOD_PROMPT, "goodbye": [9]})
    assert isinstance(same, Refused) and same.reason is Fallback.PROBE_INCONSISTENT


MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("endpoint", "body", "asked"),
    [
        ("chat/completions", {"model": "m", "messages": MESSAGES, "temperature": 0, "seed": 1}, True),
        ("chat/completions", {"model": "m", "messages": [{"role": "user", "content": None}]}, True),
        (
            "chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]},
            True,
        ),
        ("chat/completions", {"model": "m", "messages": MESSAGES, "tools": []}, False),
        ("chat/completions", {"model": "m", "messages": MESSAGES, "response_format": {}}, False),
        ("chat/completions", {"model": "m", "messages": MESSAGES, "some_new_field": 1}, False),
        (
            "chat/completions",
            {
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            },
            False,
        ),
        ("chat/completions", {"model": "m", "messages": []}, False),
        ("completions", {"model": "m", "prompt": "x", "max_tokens": 3}, True),
        ("completions", {"model": "m", "prompt": ["x"]}, False),
        ("completions", {"model": "m", "prompt": "x", "echo": True}, False),
        ("completions", {"model": "m", "prompt": "x", "suffix": "y"}, False),
        ("embeddings", {"model": "m", "input": "x"}, False),
    ],
)
def test_only_requests_whose_ids_show_everything_are_asked(
    endpoint: str, body: dict[str, Any], asked: bool
) -> None:
    assert (remote_input(endpoint, body) is not None) is asked
