"""The asyncio face of the engine: the compute loop runs in its own thread, requests talk to it by queues.

The asyncio side never touches LLMEngine: `generate` puts an add command in a thread-safe inbox and gets
an asyncio.Queue; the engine thread applies commands between steps and hands each TokenOut back with
`loop.call_soon_threadsafe`. Closing or cancelling the iterator sends an abort, which frees the blocks.
Stats are published by the engine thread after each step, before that step's tokens are delivered, so a
consumer that has seen a request finish also sees its blocks back in the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import cast

from backend.engine.config import EngineConfig
from backend.engine.embedding import EmbeddingOut
from backend.engine.errors import EngineStoppedError, QueueFullError
from backend.engine.llm_engine import LLMEngine
from backend.engine.outputs import EngineStats, TokenOut
from backend.engine.prompt import ValidPrompt
from backend.engine.sampling import SamplingParams
from backend.model.llama import LlamaModel
from backend.model.tiling_store import TilingStore

_Delivery = TokenOut | EmbeddingOut | BaseException


@dataclass(frozen=True, slots=True)
class _Add:
    request_id: str
    prompt: ValidPrompt
    params: SamplingParams | None  # None: an embedding request (backend/engine/embedding.py)
    out: asyncio.Queue[_Delivery]


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class _Stop:
    pass


class AsyncEngine:
    def __init__(
        self,
        model: LlamaModel,
        config: EngineConfig,
        eos_token_ids: frozenset[int],
        tilings: TilingStore | None = None,
    ) -> None:
        self.config = config
        self._engine = LLMEngine(model, config, eos_token_ids, tilings)
        self._inbox: queue.Queue[_Add | _Abort | _Stop] = queue.Queue()
        self._lock = threading.Lock()
        self._stats = self._engine.stats()
        self._pending_adds = 0  # adds in the inbox, counted as waiting
        self._outputs: dict[str, asyncio.Queue[_Delivery]] = {}  # owned by the engine thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    async def start(self) -> None:
        assert self._thread is None, "AsyncEngine.start() called twice"
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="tokenedge-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stopped = True
        if self._thread is None:
            return
        self._inbox.put(_Stop())
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    def stats(self) -> EngineStats:
        with self._lock:
            stats = self._stats
            pending = self._pending_adds
        return dataclasses.replace(stats, waiting=stats.waiting + pending)

    def prompt(self, ids: Seq[int]) -> ValidPrompt:
        """`ids` checked for this engine (LLMEngine.prompt), for callers without a server in front."""
        return self._engine.prompt(ids)

    def generate(
        self, prompt: ValidPrompt, params: SamplingParams, request_id: str
    ) -> AsyncIterator[TokenOut]:
        """Submit now (raises QueueFullError if the waiting queue is full) and stream the tokens.

        Iterate it with `async for`; the last TokenOut has `finish_reason` set. Closing the iterator early
        (`aclose()`, break out of `async with aclosing(...)`, task cancellation) aborts the request.
        """
        stream = self._stream(request_id, self._submit(request_id, prompt, params))
        return cast(AsyncIterator[TokenOut], stream)  # a generation request only ever gets TokenOuts

    async def embed(self, prompt: ValidPrompt, request_id: str) -> EmbeddingOut:
        """The pooled last hidden state of the prompt, computed in the engine's batches (prefill only).

        Raises like `generate` at submission; cancelling the awaiting task aborts the request.
        """
        stream = self._stream(request_id, self._submit(request_id, prompt, None))
        async with contextlib.aclosing(stream):
            result = await anext(stream)
        assert isinstance(result, EmbeddingOut)
        return result

    def _submit(
        self, request_id: str, prompt: ValidPrompt, params: SamplingParams | None
    ) -> asyncio.Queue[_Delivery]:
        if self._stopped:
            raise EngineStoppedError("the engine is stopped")
        out: asyncio.Queue[_Delivery] = asyncio.Queue()
        with self._lock:
            if self._stats.waiting + self._pending_adds >= self.config.max_waiting:
                raise QueueFullError(f"{self.config.max_waiting} requests are already waiting")
            self._pending_adds += 1
        self._inbox.put(_Add(request_id, prompt, params, out))
        return out

    async def _stream(
        self, request_id: str, out: asyncio.Queue[_Delivery]
    ) -> AsyncGenerator[TokenOut | EmbeddingOut, None]:
        finished = False
        try:
            while True:
                item = await out.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if item.finish_reason is not None:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._inbox.put(_Abort(request_id))

    # ---- engine thread -----------------------------------------------------------------------------------

    def _run(self) -> None:
        engine = self._engine
        while True:
            commands = [self._inbox.get()] if not engine.has_unfinished() else []
            while True:
                try:
                    commands.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            if any(isinstance(c, _Stop) for c in commands):
                self._abort_all(EngineStoppedError("the engine was stopped"), commands)
                self._publish()
                return
            for command in commands:
                self._apply(command)
            self._publish()
            if not engine.has_unfinished():
                continue
            try:
                outputs = engine.step()
            except Exception as exc:  # a model failure: fail the requests in flight, keep serving
                self._abort_all(EngineStoppedError(f"engine step failed: {exc!r}"), [])
                self._publish()
                continue
            self._publish()
            deliveries: list[
                tuple[asyncio.Queue[_Delivery], _Delivery]
            ] = []  # one hand-off to the event loop per step, however many tokens it made
            for output in outputs:
                out = self._outputs.get(output.request_id)
                if out is not None:
                    deliveries.append((out, output.token))
                if output.token.finish_reason is not None:
                    del self._outputs[output.request_id]
            if deliveries and self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(_put_all, deliveries)

    def _apply(self, command: _Add | _Abort | _Stop) -> None:
        if isinstance(command, _Add):
            with self._lock:
                self._pending_adds -= 1
            try:
                if command.params is None:
                    self._engine.add_embedding(command.request_id, command.prompt)
                else:
                    self._engine.add_request(command.request_id, command.prompt, command.params)
            except Exception as exc:
                self._post(command.out, exc)
                return
            self._outputs[command.request_id] = command.out
        elif isinstance(command, _Abort) and self._outputs.pop(command.request_id, None) is not None:
            self._engine.abort_request(command.request_id)

    def _publish(self) -> None:
        stats = self._engine.stats()
        with self._lock:
            self._stats = stats

    def _post(self, out: asyncio.Queue[_Delivery], item: _Delivery) -> None:
        assert self._loop is not None
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(out.put_nowait, item)

    def _abort_all(self, error: EngineStoppedError, commands: list[_Add | _Abort | _Stop]) -> None:
        """Fail every request in flight or still in the inbox, and free their blocks."""
        for command in commands:
            if isinstance(command, _Add):
                with self._lock:
                    self._pending_adds -= 1
                self._post(command.out, error)
        for request_id in list(self._outputs):
            self._engine.abort_request(request_id)
            self._post(self._outputs.pop(request_id), error)


def _put_all(deliveries: list[tuple[asyncio.Queue[_Delivery], _Delivery]]) -> None:
    for out, item in deliveries:
        out.put_nowait(item)
