"""Chat-template rendering with the model's own Jinja template, sandboxed.

Templates come from model files (GGUF metadata or tokenizer_config.json), so they are untrusted code:
they run in Jinja's `ImmutableSandboxedEnvironment` with the same options and helpers Hugging Face
gives them (`trim_blocks`, `lstrip_blocks`, `raise_exception`, `tojson`), so a template renders the
same text here as in `transformers`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template failed to render the given messages (bad messages or a template `raise_exception`)."""


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference."""

    __slots__ = ("_bos_token", "_eos_token", "_template", "source")

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = _raise_exception
        env.filters["tojson"] = _tojson
        self.source = source
        self._template = env.from_string(source)
        self._bos_token = bos_token
        self._eos_token = eos_token

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
            )
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, KeyError, AttributeError) as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
