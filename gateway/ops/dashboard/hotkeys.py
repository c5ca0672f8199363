"""The hot-keys table: which cache entries are served most, per worker, merged across workers for the page.

Each row is the key (already a hash: `te1:{scope}:{digest}`), its tenant scope (a keyed hash, `pub` or `anon`),
model, route, hits and the entry's age. Never request text, unless the operator opts in with
`dashboard.show_prompts`; then the first characters of the last user message (or prompt) are kept too.

Bounded: at most `2 * capacity` rows; past that the table is trimmed to the `capacity` most-hit keys, so a hit costs a
dict lookup and an increment, and the trim's sort is paid once per `capacity` new keys. With `--workers N` each
worker writes its table, when it changed, to a file beside the Prometheus multiprocess files; the worker answering
`/dashboard/data` adds up the tables of the live workers (`merged`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from gateway.keys.entry import Entry

PROMPT_CHARS = 80
_FILE_PREFIX = "hotkeys_"
# Set on the request only under `dashboard.show_prompts`: the text the hot-keys table may show for its key.
PROMPT: web.RequestKey[str] = web.RequestKey("tokenedge_prompt", str)


class HotKeys:
    __slots__ = ("_rows", "capacity", "dirty")

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._rows: dict[str, list[Any]] = {}  # key -> [hits, model, route, created_at, last_hit, prompt]
        self.dirty = False

    def hit(self, entry: Entry, now: float, prompt: str | None = None) -> None:
        row = self._rows.get(entry.key)
        if row is None:
            if len(self._rows) >= 2 * self.capacity:
                self._trim()
            row = self._rows[entry.key] = [0, entry.model, entry.endpoint, entry.created_at, now, None]
        row[0] += 1
        row[3], row[4] = entry.created_at, now  # a re-stored entry is younger
        if prompt is not None:
            row[5] = prompt
        self.dirty = True

    def _trim(self) -> None:
        kept = sorted(self._rows.items(), key=lambda item: -item[1][0])[: self.capacity]
        self._rows = dict(kept)

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "key": key,
                "hits": r[0],
                "model": r[1],
                "route": r[2],
                "created_at": r[3],
                "last_hit": r[4],
                "prompt": r[5],
            }
            for key, r in self._rows.items()
        ]

    def save(self, directory: str) -> None:
        """Write this worker's table for the others (multiprocess mode), when it changed."""
        if not self.dirty:
            return
        self.dirty = False
        path = Path(directory) / f"{_FILE_PREFIX}{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(self.rows()))
        tmp.replace(path)  # atomic: a reader sees the old table or the new one


def other_workers(directory: str) -> list[list[dict[str, Any]]]:
    """The tables the other live workers saved (a dead worker's file is ignored)."""
    tables = []
    for path in Path(directory).glob(f"{_FILE_PREFIX}*.json"):
        pid = int(path.stem[len(_FILE_PREFIX) :]) if path.stem[len(_FILE_PREFIX) :].isdigit() else 0
        if pid == os.getpid() or not _alive(pid):
            continue
        with contextlib.suppress(OSError, orjson.JSONDecodeError):
            tables.append(orjson.loads(path.read_bytes()))
    return tables


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def merged(
    tables: Iterable[list[dict[str, Any]]], *, now: float, top: int, show_prompts: bool
) -> list[dict[str, Any]]:
    """Hits added up per key over the tables; the `top` most-hit keys, for display."""
    total: dict[str, dict[str, Any]] = {}
    for table in tables:
        for row in table:
            seen = total.get(row["key"])
            if seen is None:
                total[row["key"]] = dict(row)
                continue
            seen["hits"] += row["hits"]
            if row["last_hit"] > seen["last_hit"]:
                seen.update({k: row[k] for k in ("created_at", "last_hit", "model")})
                seen["prompt"] = row["prompt"] or seen["prompt"]
    best = sorted(total.values(), key=lambda r: (-r["hits"], -r["last_hit"], r["key"]))[:top]
    return [_shown(row, now, show_prompts) for row in best]


def _shown(row: Mapping[str, Any], now: float, show_prompts: bool) -> dict[str, Any]:
    parts = str(row["key"]).split(":")
    out = {
        "key": row["key"],
        "tenant": parts[1] if len(parts) >= 3 else "",
        "model": row["model"],
        "route": row["route"],
        "hits": row["hits"],
        "age_s": max(0.0, now - row["created_at"]),
    }
    if show_prompts:
        out["prompt"] = row["prompt"] or ""
    return out


def prompt_text(body: Mapping[str, Any] | None) -> str | None:
    """The start of the last user message (chat) or of the prompt/input: shown only when the operator opts in."""
    if not body:
        return None
    text: Any = None
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                text = message.get("content")
                break
        if isinstance(text, list):
            text = " ".join(p.get("text", "") for p in text if isinstance(p, dict))
    else:
        text = body.get("prompt", body.get("input"))
    if isinstance(text, list):
        text = text[0] if text and isinstance(text[0], str) else None
    return text[:PROMPT_CHARS] if isinstance(text, str) else None
