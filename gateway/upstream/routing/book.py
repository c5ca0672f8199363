"""Which backend serves which model at which revision, and the one revision per model that keys use.

Keys carry one revision per model (design §3). Backends may disagree during a rolling upgrade, so the book picks
the *current* revision of each model and the pool routes that model only to backends reporting it:
- a backend that moves from revision A to B makes B newer than A (and than anything A was newer than); the
  current revision is the newest one any backend reports (its last report is kept while it is down, so losing
  the upgraded backends never brings an old revision back);
- revisions first seen side by side, with no move between them, are ordered by how many backends report them,
  then by name, so every process picks the same one.
A backend whose revision is not current gets that model's requests only when no current one is available; its
answer carries its own revision header, so the fill does not store it and the catalog keeps the current one
(`arbitrate` is the catalog's arbiter). `merge` builds the client-facing `/v1/models` from all backends' answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from gateway.upstream.catalog import parse_models

RevisionChanged = Callable[[str, str], None]  # (model, new current revision)


class RevisionBook:
    def __init__(self, backends: int) -> None:
        self.reports: list[dict[str, str] | None] = [None] * backends  # None: never answered /v1/models
        self._rank: dict[tuple[str, str], int] = {}  # (model, revision) -> generation (higher: newer)
        self._current: dict[str, str] = {}
        self.on_change: RevisionChanged | None = None

    def current(self, model: str) -> str | None:
        return self._current.get(model)

    def arbitrate(self, model: str, revision: str) -> bool:
        """The catalog's arbiter: may `revision` become the model's key revision? The current one may, an older one
        this book knows may not; one it has never seen (another process saw it first, over the invalidation bus)
        becomes the newest here too, so this process routes and keys as the one that saw it."""
        current = self._current.get(model)
        if not current or current == revision:  # "": the backends report no revision for it
            return True
        if (model, revision) in self._rank:
            return False
        self._rank[(model, revision)] = max(g for (m, _), g in self._rank.items() if m == model) + 1
        self._current[model] = revision
        return True

    def report(self, backend: int, models: Mapping[str, str]) -> None:
        """Backend `backend` serves exactly `models` (model -> revision) now (a `/v1/models` answer)."""
        before = self.reports[backend] or {}
        for model, revision in models.items():
            self._see(model, before.get(model), revision)
        self.reports[backend] = dict(models)
        self._recompute(set(models) | set(before))

    def saw(self, backend: int, model: str, revision: str) -> None:
        """One answer of `backend` carried `revision` for `model` (the revision header)."""
        report = self.reports[backend]
        if report is not None and report.get(model) == revision:
            return
        self._see(model, report.get(model) if report else None, revision)
        self.reports[backend] = {**(report or {}), model: revision}
        self._recompute({model})

    def _see(self, model: str, old: str | None, new: str) -> None:
        if old is not None and old != new:  # this backend moved: the new revision is newer than all known
            top = max((g for (m, _), g in self._rank.items() if m == model), default=0)
            self._rank[(model, new)] = max(self._rank.get((model, new), 0), top + 1)
        else:
            self._rank.setdefault((model, new), 0)

    def _recompute(self, models: set[str]) -> None:
        for model in models:
            counts: dict[str, int] = {}
            for report in self.reports:
                if report is not None and model in report:
                    counts[report[model]] = counts.get(report[model], 0) + 1
            if not counts:
                continue
            best = max(counts, key=lambda r: (self._rank.get((model, r), 0), counts[r], r))
            if self._current.get(model) != best:
                self._current[model] = best
                if self.on_change is not None:
                    self.on_change(model, best)

    def serves(self, backend: int, model: str) -> bool | None:
        """True/False from its last report; None when it never reported (it may serve anything)."""
        report = self.reports[backend]
        return None if report is None else model in report


def revisions_of(body: bytes) -> dict[str, str]:
    return {model: info.revision for model, info in parse_models(body).items()}


def served_models(body: bytes) -> dict[str, str]:
    """Every model a `/v1/models` answer lists -> its revision ("" when it reports none)."""
    revisions = revisions_of(body)
    return {model: revisions.get(model, "") for model in listed_ids(body)}


def listed_ids(body: bytes) -> dict[str, dict[str, Any]]:
    """model id -> its `/v1/models` item (every listed model, with or without a revision)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    data = doc.get("data") if isinstance(doc, dict) else None
    items = data if isinstance(data, list) else []
    return {i["id"]: i for i in items if isinstance(i, dict) and isinstance(i.get("id"), str)}


def only(body: bytes, models: tuple[str, ...]) -> bytes:
    """A `/v1/models` answer cut down to `models` (a backend configured to serve only those)."""
    return orjson.dumps({"object": "list", "data": [i for m, i in listed_ids(body).items() if m in models]})


def merge(bodies: list[bytes], book: RevisionBook) -> bytes:
    """One `/v1/models` list from every backend's: each model once, from a backend at its current revision, and
    always naming the current revision (the catalog reads its revisions from this list)."""
    merged: dict[str, dict[str, Any]] = {}
    for body in bodies:
        revisions = revisions_of(body)
        for model, item in listed_ids(body).items():
            current = book.current(model)
            if model not in merged or (current is not None and revisions.get(model) == current):
                merged[model] = item
    for model, item in merged.items():  # no backend asked reports the current revision (yet): say it anyway
        current = book.current(model)
        if current and revisions_of(orjson.dumps({"data": [item]})).get(model) != current:
            extra: dict[str, Any] = item["tokenedge"] if isinstance(item.get("tokenedge"), dict) else {}
            merged[model] = {**item, "tokenedge": {**extra, "revision": current}}
    for model in _unpromised(
        bodies
    ):  # a seeded request may reach any backend: the promise must be every one's
        extra = merged[model]["tokenedge"] if isinstance(merged[model].get("tokenedge"), dict) else {}
        if "seeded_invariant" in extra:
            merged[model] = {**merged[model], "tokenedge": {**extra, "seeded_invariant": False}}
    return orjson.dumps({"object": "list", "data": list(merged.values())})


def _unpromised(bodies: list[bytes]) -> set[str]:
    """Models some backend lists without promising invariant seeded sampling (`tokenedge.seeded_invariant`)."""
    out: set[str] = set()
    for body in bodies:
        infos = parse_models(body)
        out.update(
            model for model in listed_ids(body) if model not in infos or not infos[model].seeded_invariant
        )
    return out
