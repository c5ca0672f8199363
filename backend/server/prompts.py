"""The HTTP boundary of prompt validation: every endpoint's token ids pass `PromptLimits.validate` here once
(backend/engine/prompt.py holds the rules), and a broken rule becomes an OpenAI 400 naming the field; a prompt
that leaves no room for a new token is `context_length_exceeded`. The engine trusts the `ValidPrompt` it gets."""

from __future__ import annotations

from collections.abc import Sequence

from backend.engine.prompt import InvalidPromptError, PromptProblem, ValidPrompt
from backend.server.errors import bad_request
from backend.server.state import ServedModel


def valid_prompt(ids: Sequence[int], model: ServedModel, param: str, label: str = "") -> ValidPrompt:
    """The ids as a ValidPrompt for `model`, or a 400 for `param`; `label` prefixes the message (`input[2]`)."""
    try:
        return model.prompt_limits.validate(ids)
    except InvalidPromptError as exc:
        code = "context_length_exceeded" if exc.problem is PromptProblem.TOO_LONG else None
        message = f"{label}: {exc}" if label else str(exc)
        raise bad_request(message, param, code=code) from None
