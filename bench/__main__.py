"""`python -m bench SCENARIO [args]`: run one benchmark scenario (or `all`) and print its table."""

from __future__ import annotations

import importlib
import sys

SCENARIOS = {
    "gateway_hit": "bench.gateway_hit",
    "gateway": "bench.gateway_suite",
    "gateway_miss": "bench.miss_ttft",  # what a streamed miss pays for the gateway, against the engine direct
    "gateway_ab": "bench.gateway_ab",  # before/after of one change (needs --before DIR): not in `all`
    "e2e": "bench.e2e",
    "backend": "bench.llamacpp_peer",  # against native llama.cpp: llama-server over HTTP, our engine vs llama-bench
    "backend_hf": "bench.backend_vs_hf",  # against transformers (and llama-cpp-python's wheel, history)
    "backend_invariance": "bench.backend_invariance",
    "backend_profile": "bench.backend_profile",
    "engine_alone": "bench.engine_alone",  # our engine alone, as llama-bench measures llama.cpp (also in `backend`)
    "engines": "bench.vllm_peer",  # vLLM CPU behind the gateway, own venv (installs on first use): not in `all`
    "speculative": "bench.speculative",
    "agreement": "bench.agreement",
    "token_path": "bench.token_path",
    "key_levels": "bench.key_levels",
    "remote_tokens": "bench.remote_tokens",
    "leases": "bench.leases",
    "coherence": "bench.coherence",
    "soak": "bench.soak",
    "warmup": "bench.warmup",
    "scale": "bench.scale",
    "fleet": "bench.fleet",  # routing policies on two real llama-server engines, arms alternated: not in `all`
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in (*SCENARIOS, "all"):
        print(f"usage: python -m bench {{{'|'.join([*SCENARIOS, 'all'])}}} [args]", file=sys.stderr)
        raise SystemExit(2)
    # `all`: every scenario once (gateway_hit is a subset of the gateway suite; gateway_ab needs a second tree;
    # backend_profile is a diagnostic; engines installs vLLM into its own venv)
    skipped = ("gateway_hit", "gateway_ab", "backend_profile", "engines", "fleet")
    names = [n for n in SCENARIOS if n not in skipped] if sys.argv[1] == "all" else [sys.argv[1]]
    for name in names:
        importlib.import_module(SCENARIOS[name]).main(sys.argv[2:] if len(names) == 1 else [])


if __name__ == "__main__":
    main()
