"""Run the n choices of one request on the engine and yield text events in arrival order.

Each choice is one engine request consuming its own `generate` iterator in a task; the events meet in
one queue. Leaving the `run_choices` generator early (a stop string, a client disconnect, an error)
cancels the tasks, and cancelling a task closes its engine iterator, which aborts the engine request
and frees its blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from backend.engine.prompt import ValidPrompt
from backend.engine.sampling_params import SamplingParams
from backend.server.text_stream import TextStream
from backend.tokenizer import Tokenizer

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class ChoiceEvent:
    index: int
    text: str
    finish_reason: FinishReason | None  # set on the choice's last event


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


@contextlib.asynccontextmanager
async def _closing(stream: AsyncIterator[Any]) -> AsyncIterator[AsyncIterator[Any]]:
    """Close the engine's iterator on exit, which aborts an unfinished engine request."""
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


async def run_choices(
    generate: Callable[[ValidPrompt, SamplingParams, str], AsyncIterator[Any]],
    tokenizer: Tokenizer,
    prompt: ValidPrompt,
    params: Sequence[SamplingParams],
    stop: Sequence[str],
    request_id: str,
    usage: Usage,
    on_first_token: Callable[[float], None] | None = None,
) -> AsyncGenerator[ChoiceEvent, None]:
    """Yield every choice's text as it is produced; the last event of each choice has `finish_reason`."""
    shared = _Shared(asyncio.Queue(), usage, on_first_token, time.perf_counter())
    special = frozenset(tokenizer.encoding._special_tokens.values())
    usage.prompt_tokens = len(prompt)

    def decode(ids: Sequence[int]) -> bytes:
        return tokenizer.decode_bytes([i for i in ids if i not in special])

    tasks = [
        asyncio.create_task(
            _choice(partial(generate, prompt, p, f"{request_id}-{i}"), i, TextStream(decode, stop), shared)
        )
        for i, p in enumerate(params)
    ]
    try:
        remaining = len(tasks)
        while remaining:
            event = await shared.queue.get()
            if isinstance(event, _Failed):
                raise event.error
            if event.finish_reason is not None:
                remaining -= 1
            yield event
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(slots=True)
class _Shared:
    """What the choices of one request share: the event queue, the usage they add to, the first-token clock."""

    queue: asyncio.Queue[ChoiceEvent | _Failed]
    usage: Usage
    on_first_token: Callable[[float], None] | None
    started: float
    seen_token: bool = False

    def count(self, index: int, out: Any) -> None:
        if not self.seen_token and self.on_first_token is not None:
            self.on_first_token(time.perf_counter() - self.started)
        self.seen_token = True
        self.usage.completion_tokens += 1
        if index == 0:
            self.usage.cached_tokens = out.num_cached_tokens


async def _choice(
    start: Callable[[], AsyncIterator[Any]], index: int, text: TextStream, shared: _Shared
) -> None:
    """One choice: its engine request's tokens as text events; a failure becomes a `_Failed` event."""
    try:
        async with _closing(start()) as stream:
            async for out in stream:
                shared.count(index, out)
                event = _event(index, out, text)
                if event is not None:
                    shared.queue.put_nowait(event)
                    if event.finish_reason is not None:
                        return  # on a stop string, leaving the `async with` aborts the engine request
        shared.queue.put_nowait(ChoiceEvent(index, text.finish().text, "length"))
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        shared.queue.put_nowait(_Failed(exc))


def _event(index: int, out: Any, text: TextStream) -> ChoiceEvent | None:
    """The text event one engine token makes, if any; the EOS/stop token itself is not rendered."""
    if out.finish_reason == "stop":
        return ChoiceEvent(index, text.finish().text, "stop")
    delta = text.push([out.token_id])
    if delta.stopped:
        return ChoiceEvent(index, delta.text, "stop")
    if out.finish_reason == "length":
        return ChoiceEvent(index, delta.text + text.finish().text, "length")
    return ChoiceEvent(index, delta.text, None) if delta.text else None
