"""Token ids from a third-party engine: what vLLM/SGLang (`POST /tokenize`) or llama.cpp's `llama-server`
(`POST /apply-template` + `POST /tokenize`) say the model will see, for the `tokens` key level.

The engine's own routes render the chat template and tokenize exactly as its chat and completion routes do, so a
request keyed on their ids shares an entry with another iff the model sees the same ids. They are trusted only
after a probe (`gateway.tokens.probe`) verified them, once per (endpoint kind, model, revision), again after
`remote_probe_ttl_s`; the probe also asks the model route itself for one greedy token of its first prompt and
requires its `usage.prompt_tokens` to be the tokenize route's count. A request is asked only once per new body
(the request memo keeps the canonical bytes), and each ask is bounded: `remote_timeout_s` (queueing for one of
`remote_concurrency` slots included, which probes share, so unknown model names cannot multiply the calls in
flight), and a breaker that stops asking for `remote_breaker_cooldown_s` after `remote_breaker_failures` failures
of the engine in a row (a 400/422 for one request is that request's fault and does not count). Any failure keys
that request `exact`: never an error, always counted (`tokenedge_key_level_fallbacks_total{reason}`), and timed
(`tokenedge_remote_tokenize_duration_seconds{outcome}`).
Only requests whose every field is a decoding parameter and whose message content is text go this way: anything
else (tools, images, response_format, ...) could change what the model sees without changing these ids.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from multidict import CIMultiDict

from gateway.config.settings import TokensConfig
from gateway.keys.canonical import Fallback
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.ratelog import RateLimitedLog
from gateway.tokens.probe import CHAT_PROBES, PROMPT_PROBES, Refused, Verified, is_ids, judge
from gateway.upstream.transport import UpstreamTransport
from gateway.web.errors import UpstreamError

log = logging.getLogger("tokenedge.tokens")
KINDS: Final = ("vllm", "llamacpp")  # the probe order after the backend's own GET /v1/tokenizer
ENDPOINT_KIND: Final = {"chat/completions": "chat", "completions": "prompt"}
# Fields that only steer decoding: whatever their value, the prompt ids stay the same on these engines.
DECODING: Final = frozenset(
    {
        "model",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "seed",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "stream",
        "stream_options",
        "user",
        "metadata",
        "store",
        "service_tier",
    }
)
_ALLOWED: Final = {"chat/completions": DECODING | {"messages"}, "completions": DECODING | {"prompt"}}
_DROPPED_HEADERS: Final = frozenset({"content-length", "content-type", "transfer-encoding"})


_ABSENT: Final = frozenset({200, 400, 404, 405, 422, 501})  # answers that say "no such route (or shape)"
_REQUEST_FAULT: Final = frozenset({400, 422})  # a request the engine refuses (not counted by the breaker)
PROBE_GENERATION_BOUND: Final = 10  # the probe's one-token generation may take this many remote_timeout_s
MAX_VERDICTS: Final = 4096  # model names come from clients: the table is bounded, oldest dropped first


class _NoIds(Exception):
    """The engine answered, but not with ids (a 4xx/5xx, or another shape)."""

    def __init__(self, message: str, status: int = 200) -> None:
        super().__init__(message)
        self.status = status

    @property
    def transient(self) -> bool:
        """A refused credential, a rate limit or a server error says nothing about the route: ask again soon."""
        return self.status not in _ABSENT


def remote_input(endpoint: str, body: Mapping[str, Any]) -> Any:
    """The messages (chat) or prompt text the engine is asked to tokenize, or None where its ids would not show
    everything the model receives."""
    allowed = _ALLOWED.get(endpoint)
    if allowed is None or not allowed.issuperset(body):
        return None
    if endpoint == "completions":
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else None
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        return None
    for message in value:
        if not isinstance(message, Mapping) or not _text_content(message.get("content")):
            return None
    return value


def _text_content(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    )


@dataclass(slots=True)
class _Verdict:
    result: Verified | Refused
    until: float


class RemoteTokenizers:
    """One per process: verdicts per (endpoint kind, model, revision), and the bounded per-request asks."""

    def __init__(
        self,
        config: TokensConfig,
        upstream: UpstreamTransport,
        metrics: GatewayMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._config = config
        self._upstream = upstream
        self._metrics = metrics
        self._clock = clock
        self._verdicts: dict[tuple[str, str, str], _Verdict] = {}
        self._probes: dict[tuple[str, str, str], asyncio.Task[tuple[Verified | Refused, bool]]] = {}
        self._slots = asyncio.Semaphore(config.remote_concurrency)
        self._failures = 0
        self._open_until = float("-inf")
        self._log = RateLimitedLog(log, 10.0, clock)
        self.calls = 0  # remote tokenize asks made for requests (not probes): tests count them

    def known_verdict(self, endpoint: str, model: str, revision: str) -> Verified | Refused | None:
        """`verdict`'s answer while it needs no await (a fresh verdict, or an endpoint never keyed on remote ids);
        None where `verdict` would probe (never probed, or its verdict expired: the engine may have changed its
        template under the same revision)."""
        kind = ENDPOINT_KIND.get(endpoint)
        if kind is None:
            return Refused(Fallback.NO_TOKENIZER, f"{endpoint}: not keyed on remote ids")
        known = self._verdicts.get((kind, model, revision))
        return known.result if known is not None and self._clock() < known.until else None

    async def verdict(
        self, endpoint: str, model: str, revision: str, headers: Mapping[str, str]
    ) -> Verified | Refused:
        """Verified (the engine's ids key this model) or Refused with the reason; no await once probed."""
        kind = ENDPOINT_KIND.get(endpoint)
        if kind is None:
            return Refused(Fallback.NO_TOKENIZER, f"{endpoint}: not keyed on remote ids")
        slot = (kind, model, revision)
        known = self._verdicts.get(slot)
        if known is not None and self._clock() < known.until:
            return known.result
        task = self._probes.get(slot)
        if task is None:
            task = self._probes[slot] = asyncio.ensure_future(self._probe(kind, model, dict(headers)))
            task.add_done_callback(lambda _: self._probes.pop(slot, None))
        result, transient = await asyncio.shield(task)
        ttl_s = self._config.remote_breaker_cooldown_s if transient else self._config.remote_probe_ttl_s
        self._verdicts.pop(slot, None)
        self._verdicts[slot] = _Verdict(result, self._clock() + ttl_s)
        while len(self._verdicts) > MAX_VERDICTS:
            del self._verdicts[next(iter(self._verdicts))]
        return result

    async def _probe(self, kind: str, model: str, headers: dict[str, str]) -> tuple[Verified | Refused, bool]:
        """The first engine kind whose probes verify, else the most telling refusal; True when a transport
        failure (not an answer) decided it, so it is asked again soon."""
        first: Refused | None = None
        transient = False
        for engine in KINDS:
            results: dict[str, Any] = {}
            for name, value in CHAT_PROBES if kind == "chat" else PROMPT_PROBES:
                try:
                    results[name] = await self._bounded(engine, kind, model, value, headers)
                except (_NoIds, UpstreamError, TimeoutError) as exc:
                    transient = transient or not isinstance(exc, _NoIds) or exc.transient
                    if not results:  # the first probe: this engine has no such route, or it failed
                        absent = isinstance(exc, _NoIds) and not exc.transient
                        reason = Fallback.NO_TOKENIZER if absent else Fallback.PROBE_FAILED
                        first = first or Refused(reason, f"{engine}: {_why(exc)}")
                        break
                    results[name] = None
            else:
                verdict: Verified | Refused = judge(engine, kind, results)
                if isinstance(verdict, Verified):
                    disagree, flaky = await self._routes_agree(kind, model, headers, len(results["hello"]))
                    if disagree is None:
                        log.info(
                            "%s %s: token-exact keys from %s (%s)", model, kind, engine, verdict.identity
                        )
                        return verdict, False
                    verdict, transient = disagree, transient or flaky
                first = verdict if first is None or first.reason is Fallback.NO_TOKENIZER else first
        assert first is not None
        log.info("%s %s: keys stay exact: %s", model, kind, first.detail)
        return first, transient

    async def _routes_agree(
        self, kind: str, model: str, headers: Mapping[str, str], expected: int
    ) -> tuple[Refused | None, bool]:
        """The model route itself must count the first probe's prompt as the tokenize route did: one greedy token
        of it, and its `usage.prompt_tokens` (a route that adds a BOS the tokenize route omits fails here).
        (None, _) when they agree; else the refusal, and whether a failure (not an answer) decided it."""
        path, field = (
            ("/v1/chat/completions", "messages") if kind == "chat" else ("/v1/completions", "prompt")
        )
        prompt: Any = CHAT_PROBES[0][1] if kind == "chat" else PROMPT_PROBES[0][1]
        doc = {"model": model, field: prompt, "max_tokens": 1, "temperature": 0}
        try:  # a generation, not a tokenization: a longer bound, once per probe
            async with asyncio.timeout(PROBE_GENERATION_BOUND * self._config.remote_timeout_s):
                answer = await self._post(path, doc, headers)
        except (_NoIds, UpstreamError, TimeoutError) as exc:
            flaky = not isinstance(exc, _NoIds) or exc.transient
            return Refused(Fallback.PROBE_FAILED, f"{path}: {_why(exc)}"), flaky
        usage = answer.get("usage") if isinstance(answer, dict) else None
        counted = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if not isinstance(counted, int):
            return Refused(Fallback.PROBE_FAILED, f"{path} reports no usage to check the ids against"), False
        if counted != expected:
            why = f"{path} counts {counted} prompt tokens where the tokenize route gave {expected} ids"
            return Refused(Fallback.PROBE_INCONSISTENT, why), False
        return None, False

    async def ids(
        self, verified: Verified, endpoint: str, model: str, value: Any, headers: Mapping[str, str]
    ) -> list[int] | Fallback:
        """This request's ids from the engine, or why not (the request is then keyed `exact`)."""
        now = self._clock()
        if now < self._open_until:
            return Fallback.BREAKER_OPEN
        self.calls += 1
        started = time.perf_counter()
        engine_failed = True
        try:
            ids = await self._bounded(verified.kind, ENDPOINT_KIND[endpoint], model, value, headers)
        except TimeoutError:
            outcome = Fallback.TOKENIZE_TIMEOUT
        except (_NoIds, UpstreamError) as exc:
            self._log.warning("tokenize", "%s: remote tokenization failed: %s", model, _why(exc))
            outcome = Fallback.TOKENIZE_ERROR
            # A 400/422 is this request's own fault (the chat route refuses it too): not the engine failing.
            engine_failed = not (isinstance(exc, _NoIds) and exc.status in _REQUEST_FAULT)
        else:
            self._observe("ok", started)
            self._failures = 0
            return ids
        self._observe(outcome.value if engine_failed else "refused", started)
        if engine_failed:
            self._failures += 1
            if self._failures >= self._config.remote_breaker_failures:
                self._open_until = self._clock() + self._config.remote_breaker_cooldown_s
                self._failures = 0
        return outcome

    def _observe(self, outcome: str, started: float) -> None:
        self._metrics.remote_tokenize_duration.labels(outcome).observe(time.perf_counter() - started)

    async def _bounded(
        self, engine: str, kind: str, model: str, value: Any, headers: Mapping[str, str]
    ) -> list[int]:
        """One tokenization within the timeout, a slot included; raises TimeoutError, UpstreamError or _NoIds."""
        async with asyncio.timeout(self._config.remote_timeout_s), self._slots:
            return await self._tokenize(engine, kind, model, value, headers)

    async def _tokenize(
        self, engine: str, kind: str, model: str, value: Any, headers: Mapping[str, str]
    ) -> list[int]:
        if engine == "vllm":  # chat: exactly the chat route's template ids, generation prompt included
            field = "messages" if kind == "chat" else "prompt"
            extra = {"add_generation_prompt": True} if kind == "chat" else {}
            return _ids(await self._post("/tokenize", {"model": model, field: value, **extra}, headers))
        text = value
        if kind == "chat":  # llama-server renders, then tokenizes as its chat route does (specials parsed)
            doc = await self._post("/apply-template", {"model": model, "messages": value}, headers)
            text = doc.get("prompt") if isinstance(doc, dict) else None
            if not isinstance(text, str):
                raise _NoIds("/apply-template answered no prompt")
        body = {"model": model, "content": text, "add_special": True, "parse_special": True}
        return _ids(await self._post("/tokenize", body, headers))

    async def _post(self, path: str, doc: Mapping[str, Any], headers: Mapping[str, str]) -> Any:
        out: CIMultiDict[str] = CIMultiDict(
            (k, v) for k, v in headers.items() if k.lower() not in _DROPPED_HEADERS
        )
        out["Content-Type"] = "application/json"
        resp = await self._upstream.request("POST", path, out, orjson.dumps(doc))
        if resp.status != 200:
            raise _NoIds(f"POST {path} answered {resp.status}", resp.status)
        try:
            return orjson.loads(resp.body)
        except orjson.JSONDecodeError:
            raise _NoIds(f"POST {path} answered no JSON") from None


def _ids(doc: Any) -> list[int]:
    tokens: Any = doc.get("tokens") if isinstance(doc, dict) else None
    if not is_ids(tokens):
        raise _NoIds("/tokenize answered no token ids")
    return list(tokens)


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return exc.message if isinstance(exc, UpstreamError) else str(exc)
