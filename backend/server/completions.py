"""`POST /v1/chat/completions` and `POST /v1/completions`: parse, tokenize, validate each prompt once
(backend/server/prompts.py), compile a response_format grammar (cached), run the choices (n per prompt), and
answer as one JSON body or as an SSE stream (backend/server/reply.py). The first event is awaited before a
stream is opened, so errors that happen at admission (a full queue) still get their status code."""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

from aiohttp import web

from backend.engine.errors import EngineError
from backend.engine.grammar import CompiledGrammar, GrammarCompiler, GrammarError
from backend.engine.prompt import ValidPrompt
from backend.engine.sampling_params import SamplingParams
from backend.server.errors import ApiError, bad_request, translate_engine_error
from backend.server.generation import Choice, Usage, run_choices
from backend.server.logprobs import LogprobRenderer
from backend.server.prompts import valid_prompt
from backend.server.protocol import Endpoint, GenerationRequest, parse_request
from backend.server.reply import Reply, collect_reply, stream_reply
from backend.server.state import (
    ENGINE_KEY,
    GRAMMARS_KEY,
    LIMITS_KEY,
    METRICS_KEY,
    MODEL_KEY,
    ServedModel,
    ServerLimits,
)
from backend.server.tools import render_messages, tool_schema
from backend.server.tools import strict as tools_strict
from backend.tokenizer import ChatTemplateError


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "completion")


async def _serve(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    app = request.app
    model, limits = app[MODEL_KEY], app[LIMITS_KEY]
    try:
        body = await request.json()
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None
    req = parse_request(body, endpoint, limits.max_n)
    check_model(req, model)
    check_token_ids(req, model)
    prompts = prompts_of(req, model)
    grammar = compile_grammar(req, app[GRAMMARS_KEY])
    choices = [
        Choice(prompt, params, counts_prompt=j == 0)
        for prompt in prompts
        for j, params in enumerate(choice_params(req, len(prompt), model, limits, grammar))
    ]
    meta = response_meta(endpoint, model)
    usage = Usage()
    events = run_choices(
        app[ENGINE_KEY].generate,
        model.tokenizer,
        choices,
        req.stop,
        meta["id"],
        usage,
        on_first_token=app[METRICS_KEY].ttft_seconds.observe,
    )
    echoes = [_echo(req, model, p) for p in prompts for _ in range(req.n)]
    reply = Reply(req, meta, LogprobRenderer(model.tokenizer), echoes)
    async with contextlib.aclosing(events):
        try:
            first = await anext(events)
        except EngineError as exc:
            raise translate_engine_error(exc, limits.retry_after_s) from exc
        if req.stream:
            return await stream_reply(request, reply, first, events, usage)
        return await collect_reply(reply, first, events, usage)


def prompts_of(req: GenerationRequest, model: ServedModel) -> list[ValidPrompt]:
    tokenizer = model.tokenizer
    if req.endpoint == "chat":
        try:
            messages = render_messages(req.messages, req.tools)
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except (ChatTemplateError, ValueError) as exc:
            raise bad_request(str(exc), "messages") from exc
        return [valid_prompt(tokenizer.encode(text), model, "messages")]
    many = len(req.prompts) > 1
    return [
        valid_prompt(
            tokenizer.encode(p) if isinstance(p, str) else p, model, "prompt", f"prompt[{i}]" if many else ""
        )
        for i, p in enumerate(req.prompts)
    ]


def _echo(req: GenerationRequest, model: ServedModel, prompt: ValidPrompt) -> str:
    """The text `echo` puts before a completion: the prompt as the model read it."""
    return model.tokenizer.decode(list(prompt.ids)) if req.echo else ""


def compile_grammar(req: GenerationRequest, compiler: GrammarCompiler) -> CompiledGrammar | None:
    """The request's grammar, from response_format or from active tools (never both: protocol refuses that)."""
    if req.tools is not None and req.tools.active:
        try:
            return compiler.json_schema(tool_schema(req.tools), tools_strict(req.tools))
        except GrammarError as exc:
            raise bad_request(f"tools: {exc}", "tools") from None
    if req.response_format is None:
        return None
    try:
        return compiler.json_schema(req.response_format.schema, req.response_format.strict)
    except GrammarError as exc:
        raise bad_request(f"response_format: {exc}", "response_format") from None


def check_token_ids(req: GenerationRequest, model: ServedModel) -> None:
    """400 for a logit_bias or stop_token_ids id outside the vocabulary."""
    vocab = model.tokenizer.vocab_size
    for param, ids in (
        ("logit_bias", [t for t, _ in req.logit_bias]),
        ("stop_token_ids", req.stop_token_ids),
    ):
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise bad_request(f"{param}: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param)


def check_model(req: GenerationRequest, model: ServedModel) -> None:
    """404 `model_not_found` unless the request names this model or none."""
    if req.model is not None and req.model != model.id:
        raise model_not_found(req.model)


def model_not_found(name: str) -> ApiError:
    return ApiError(
        404,
        f"the model '{name}' does not exist",
        type="not_found_error",
        param="model",
        code="model_not_found",
    )


def response_meta(endpoint: Endpoint, model: ServedModel) -> dict[str, Any]:
    """The fields every response object and chunk of one request shares, with a fresh id."""
    prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": model.id,
        "system_fingerprint": model.revision,
    }


def choice_params(
    req: GenerationRequest,
    prompt_len: int,
    model: ServedModel,
    limits: ServerLimits,
    grammar: CompiledGrammar | None = None,
) -> list[SamplingParams]:
    """One SamplingParams per choice (choice i seeded `seed + i`); 400 if max_tokens overflows the context."""
    room = model.max_model_len - prompt_len
    max_tokens = min(limits.default_max_tokens, room) if req.max_tokens is None else req.max_tokens
    if max_tokens > room:
        raise bad_request(
            f"max_tokens {max_tokens} plus the prompt's {prompt_len} tokens exceeds the maximum context "
            f"length {model.max_model_len}",
            "max_tokens",
            code="context_length_exceeded",
        )
    if req.min_tokens > max_tokens:
        raise bad_request(f"min_tokens {req.min_tokens} is above max_tokens {max_tokens}", "min_tokens")
    return [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            seed=None if req.seed is None else req.seed + i,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            repetition_penalty=req.repetition_penalty,
            logit_bias=req.logit_bias,
            min_tokens=req.min_tokens,
            logprobs=req.logprobs,
            grammar=grammar,
            cache_salt=req.cache_salt,
        )
        for i in range(req.n)
    ]
