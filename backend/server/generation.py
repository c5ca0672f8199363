"""Run the choices of one request on the engine and yield text events in arrival order.

A choice is a (prompt, SamplingParams) pair: n per prompt, prompt-major (OpenAI's choice order for a list of
prompts). Each choice is one engine request consuming its own `generate` iterator in a task; the events meet in
one queue. Leaving the `run_choices` generator early (a stop string, a client disconnect, an error)
cancels the tasks, and cancelling a task closes its engine iterator, which aborts the engine request
and frees its blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from backend.engine.logprobs import TokenLogprobs
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
    # the generated tokens behind this event's text (those whose text was held back earlier included), when
    # the request asked for logprobs; the EOS or stop token that ends a choice is not among them
    logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True, slots=True)
class Choice:
    prompt: ValidPrompt
    params: SamplingParams
    counts_prompt: bool  # the first choice of its prompt: its prompt and cached tokens go into usage


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
    choices: Sequence[Choice],
    stop: Sequence[str],
    request_id: str,
    usage: Usage,
    on_first_token: Callable[[float], None] | None = None,
) -> AsyncGenerator[ChoiceEvent, None]:
    """Yield every choice's text as it is produced; the last event of each choice has `finish_reason`."""
    shared = _Shared(asyncio.Queue(), usage, on_first_token, time.perf_counter())
    special = frozenset(tokenizer.encoding._special_tokens.values())
    usage.prompt_tokens = sum(len(c.prompt) for c in choices if c.counts_prompt)

    def decode(ids: Sequence[int]) -> bytes:
        return tokenizer.decode_bytes([i for i in ids if i not in special])

    tasks = [
        asyncio.create_task(
            _choice(
                partial(generate, c.prompt, c.params, f"{request_id}-{i}"),
                _ChoiceState(i, TextStream(decode, stop), c.counts_prompt),
                shared,
            )
        )
        for i, c in enumerate(choices)
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

    def count(self, choice: _ChoiceState, out: Any) -> None:
        if not self.seen_token and self.on_first_token is not None:
            self.on_first_token(time.perf_counter() - self.started)
        self.seen_token = True
        self.usage.completion_tokens += 1
        if choice.counts_prompt and not choice.seen_token:
            self.usage.cached_tokens += out.num_cached_tokens
        choice.seen_token = True


@dataclass(slots=True)
class _ChoiceState:
    index: int
    text: TextStream
    counts_prompt: bool
    seen_token: bool = False
    pending: list[TokenLogprobs] = field(default_factory=list)  # logprobs of tokens not yet in an event

    def event(self, text: str, finish_reason: FinishReason | None) -> ChoiceEvent:
        logprobs, self.pending = tuple(self.pending), []
        return ChoiceEvent(self.index, text, finish_reason, logprobs)


async def _choice(start: Callable[[], AsyncIterator[Any]], choice: _ChoiceState, shared: _Shared) -> None:
    """One choice: its engine request's tokens as text events; a failure becomes a `_Failed` event."""
    try:
        async with _closing(start()) as stream:
            async for out in stream:
                shared.count(choice, out)
                event = _event(choice, out)
                if event is not None:
                    shared.queue.put_nowait(event)
                    if event.finish_reason is not None:
                        return  # on a stop string, leaving the `async with` aborts the engine request
        shared.queue.put_nowait(choice.event(choice.text.finish().text, "length"))
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        shared.queue.put_nowait(_Failed(exc))


def _event(choice: _ChoiceState, out: Any) -> ChoiceEvent | None:
    """The text event one engine token makes, if any; the EOS/stop token itself is not rendered."""
    text = choice.text
    if out.finish_reason == "stop":
        return choice.event(text.finish().text, "stop")
    if out.logprobs is not None:
        choice.pending.append(out.logprobs)
    delta = text.push([out.token_id])
    if delta.stopped:
        return choice.event(delta.text, "stop")
    if out.finish_reason == "length":
        return choice.event(delta.text + text.finish().text, "length")
    return choice.event(delta.text, None) if delta.text else None
