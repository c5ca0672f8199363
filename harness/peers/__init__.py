"""The systems tokenedge is measured against or runs in front of, each started on loopback: llama.cpp (built
natively: llama-server, llama-bench and its formats; llama-cpp-python in its own venv), vLLM CPU in its own venv,
and the gateway's peers (bare aiohttp, nginx, the LiteLLM proxy) with the loopback servers they need."""
