"""Estimated money saved by a hit: the stored usage priced with the operator's per-model table (`dashboard.prices`).

Prices are USD per million tokens, input and output apart, written `MODEL=INPUT/OUTPUT`; `*` prices every model
not listed. A model with no price saves tokens but no money (the page says so), never a guessed amount.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Price = tuple[float, float]  # USD per million input tokens, per million output tokens
ANY_MODEL = "*"


def parse_prices(entries: Iterable[str]) -> dict[str, Price]:
    """`["gpt-4o-mini=0.15/0.60", "*=1/2"]` -> {model: (input, output)}; ValueError naming the bad entry."""
    table: dict[str, Price] = {}
    for entry in entries:
        model, sep, pair = entry.rpartition("=")
        inp, slash, out = pair.partition("/")
        try:
            price = (float(inp), float(out))
        except ValueError:
            price = (-1.0, -1.0)
        if not (sep and slash and model.strip()) or min(price) < 0:
            raise ValueError(
                f"{entry!r} must be MODEL=INPUT/OUTPUT in USD per million tokens, e.g. "
                "'gpt-4o-mini=0.15/0.60'"
            )
        if model.strip() in table:
            raise ValueError(f"{model.strip()!r} is priced twice")
        table[model.strip()] = price
    return table


def saved_usd(prices: Mapping[str, Price], model: str, usage: Mapping[str, Any] | None) -> float:
    """What the upstream would have charged for this usage; 0 without a price or usage."""
    price = prices.get(model) or prices.get(ANY_MODEL)
    if price is None or not usage:
        return 0.0
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    prompt = prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else 0
    completion = completion if isinstance(completion, int) and not isinstance(completion, bool) else 0
    return (prompt * price[0] + completion * price[1]) / 1_000_000
