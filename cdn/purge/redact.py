"""Secret redaction for purge logs, errors and config reprs: one place that knows what to hide."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["REDACTED", "Redactor", "redacted_repr"]

REDACTED = "***"


class Redactor:
    """Replaces every occurrence of the given secrets in a string (longest first, empty ones ignored)."""

    __slots__ = ("_secrets",)

    def __init__(self, secrets: Iterable[str | None]) -> None:
        self._secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text


def redacted_repr(obj: object, fields: Iterable[str], secret_fields: frozenset[str]) -> str:
    parts = []
    for name in fields:
        value = getattr(obj, name)
        shown = REDACTED if name in secret_fields and value else repr(value)
        parts.append(f"{name}={shown}")
    return f"{type(obj).__name__}({', '.join(parts)})"
