"""`python -m gateway --print-config`: the effective configuration as TOML, each value with where it came from.

The output is valid TOML that loads back to the same config, except that secrets (tokens, keys, passwords in URLs)
are shown as `"***"` so the output can be pasted into an issue.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping
from typing import Any

from gateway.config.settings import ROUTES, GatewayConfig, dotted, env_name, setting_paths

_SECRET_NAME = re.compile(r"(token|api_key|secret|password)$")
_URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@/]+@")


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return toml_value(value.value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # an array-of-tables item, inline
        fields = (
            f"{f.name} = {toml_value(_shown(f.name, getattr(value, f.name)))}"
            for f in dataclasses.fields(value)
        )
        return "{" + ", ".join(fields) + "}"
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a valid TOML basic string


def _shown(name: str, value: Any) -> Any:
    if isinstance(value, str) and value and _SECRET_NAME.search(name):
        return "***"
    if isinstance(value, str):
        return _URL_PASSWORD.sub(r"\1***@", value)
    return value


def render(config: GatewayConfig, sources: Mapping[str, str]) -> str:
    lines: list[str] = []
    current: tuple[str, ...] = ()
    for setting in setting_paths():
        table, name = setting[:-1], setting[-1]
        if table != current:
            lines.append(("\n" if lines else "") + f"[{dotted(table)}]")
            current = table
        section: Any = getattr(config, table[0])
        if table[0] == ROUTES:
            section = section[table[1]]
        value = toml_value(_shown(name, getattr(section, name)))
        origin = sources.get(dotted(setting), "default")
        hint = "" if origin.startswith("env ") else f"; env {env_name(setting)}"
        lines.append(f"{name} = {value}  # {origin}{hint}")
    return "\n".join(lines) + "\n"
