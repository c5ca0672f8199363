"""A real backend app (protocol, tokenizer, text stream, both transports) over a deterministic scripted engine.

The engine's answer is a function of the prompt ids it receives, so two transports that tokenized a prompt
differently give different answers; it records every prompt so a test can also compare them directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from backend.engine.outputs import EngineStats, TokenOut
from backend.engine.prompt import ValidPrompt
from backend.engine.sampling_params import SamplingParams
from backend.server import ServedModel, ServerLimits, create_app
from backend.tokenizer import Tokenizer
from tokenedge_wire.pattern import GPT2

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_byte_tokenizer(template: str = CHATML) -> Tokenizer:
    """Bytes as tokens plus a few merges, ChatML specials and template: tiny, but shaped like SmolLM2's."""
    ranks = {bytes([b]): b for b in range(256)}
    for word in (b" t", b"he", b" the", b"  ", b"in", b"er"):
        ranks[word] = len(ranks)
    return Tokenizer(
        name="chatml-bytes",
        pattern=GPT2,
        mergeable_ranks=ranks,
        special_tokens={"<|im_start|>": len(ranks), "<|im_end|>": len(ranks) + 1},
        vocab_size=len(ranks) + 2,
        bos_token_id=None,
        eos_token_ids=[len(ranks) + 1],
        chat_template=template,
    )


class EchoEngine:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.eos = min(tokenizer.eos_token_ids)
        self.prompts: list[list[int]] = []

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 64, 64, 0, 0, 0, 0)

    async def generate(
        self, prompt: ValidPrompt, params: SamplingParams, request_id: str
    ) -> AsyncIterator[TokenOut]:
        prompt_ids = prompt.ids
        self.prompts.append(list(prompt_ids))
        text = f" {len(prompt_ids)} tokens, checksum {sum(i * (k + 1) for k, i in enumerate(prompt_ids)) % 9973}."
        script = [*self.tokenizer.encode(text + ' ünïcode 😀 "quoted"\n'), self.eos]
        for i, token in enumerate(script[: params.max_tokens]):
            await asyncio.sleep(0)
            last = token == self.eos or i + 1 == params.max_tokens
            yield TokenOut(
                token, ("stop" if token == self.eos else "length") if last else None, len(prompt_ids), 0
            )


def backend_app(
    tokenizer: Tokenizer, engine: EchoEngine, *, model_id: str = "tiny", max_model_len: int = 256
) -> web.Application:
    model = ServedModel(
        id=model_id, revision="rev-1", tokenizer=tokenizer, max_model_len=max_model_len, created=0
    )
    return create_app(model, lambda: engine, ServerLimits(max_n=3, default_max_tokens=64))


def joined(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with content parts joined into one string, as the backend templates them."""
    return [
        {
            **m,
            "content": m["content"]
            if isinstance(m["content"], str)
            else "".join(p["text"] for p in m["content"]),
        }
        for m in messages
    ]


def oracle_ids(tok: Tokenizer, endpoint: str, body: dict[str, Any]) -> list[int]:
    """The ids the backend computes itself (backend/server/completions.py `_prompt_ids`)."""
    if endpoint == "chat/completions":
        return tok.encode(tok.apply_chat_template(joined(body["messages"]), add_generation_prompt=True))
    return tok.encode(body["prompt"])
