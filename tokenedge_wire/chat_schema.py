"""The chat message rules the model can honour, shared by the gateway and the backend (pure, stdlib only).

A role the chat template does not know, or a user/system message without content, would be rendered into a prompt
the model was never trained on (or fail inside the template): it is refused with a 400 naming the field, before any
upstream call, and never cached. `assistant` may have `content: null` (a tool-call turn, as in OpenAI's API).
This module imports nothing from the gateway so the backend can import the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool", "function")
CONTENT_REQUIRED: frozenset[str] = frozenset({"system", "developer", "user", "tool", "function"})


@dataclass(frozen=True, slots=True)
class Problem:
    param: str  # e.g. "messages[0].role"
    expected: str  # what the field must be, for the error message
    value: Any


def message_problem(index: int, message: Any) -> Problem | None:
    """The first rule `messages[index]` breaks, or None."""
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        return Problem(where, "an object", message)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        return Problem(f"{where}.role", f"one of {', '.join(ROLES)}", role)
    content = message.get("content")
    if content is None and role in CONTENT_REQUIRED:
        return Problem(
            f"{where}.content", f"a string or a list of parts for role {role!r} (not null)", content
        )
    if content is not None and not isinstance(content, str | list):
        return Problem(f"{where}.content", "a string, a list of parts or null", content)
    return None


def messages_problem(messages: Any) -> Problem | None:
    if not isinstance(messages, list) or not messages:
        return Problem("messages", "a non-empty list of message objects", messages)
    for index, message in enumerate(messages):
        problem = message_problem(index, message)
        if problem is not None:
            return problem
    return None
