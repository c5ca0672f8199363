"""`python -m bench SCENARIO [args]`: run one benchmark scenario (or `all`) and print its table."""

from __future__ import annotations

import importlib
import sys

# Every scenario: bench/scenarios/NAME.py, with `main(argv)`.
SCENARIOS = (
    "gateway_hit",
    "gateway",
    "gateway_miss",  # what a streamed miss pays for the gateway, against the engine direct
    "gateway_ab",  # before/after of one change (needs --before DIR): not in `all`
    "e2e",
    "backend",  # against native llama.cpp: llama-server over HTTP, our engine vs llama-bench
    "backend_hf",  # against transformers (and llama-cpp-python's wheel, history)
    "backend_invariance",
    "backend_profile",
    "engine_alone",  # our engine alone, as llama-bench measures llama.cpp (also in `backend`)
    "decode_depth",  # decode after a long context: our engine alone against llama-bench -d
    "engines",  # vLLM CPU behind the gateway, own venv (installs on first use): not in `all`
    "speculative",
    "agreement",
    "token_path",
    "key_levels",
    "remote_tokens",
    "leases",
    "coherence",
    "soak",
    "warmup",
    "scale",
    "fleet",  # routing policies on two real llama-server engines, arms alternated: not in `all`
    "failover",  # SIGKILL, then a 15 s SIGSTOP, on two real llama-server engines under load: not in `all`
)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in (*SCENARIOS, "all"):
        print(f"usage: python -m bench {{{'|'.join([*SCENARIOS, 'all'])}}} [args]", file=sys.stderr)
        raise SystemExit(2)
    # `all`: every scenario once (gateway_hit is a subset of the gateway suite; gateway_ab needs a second tree;
    # backend_profile is a diagnostic; engines installs vLLM into its own venv)
    skipped = ("gateway_hit", "gateway_ab", "backend_profile", "engines", "fleet", "failover")
    names = [n for n in SCENARIOS if n not in skipped] if sys.argv[1] == "all" else [sys.argv[1]]
    for name in names:
        importlib.import_module(f"bench.scenarios.{name}").main(sys.argv[2:] if len(names) == 1 else [])


if __name__ == "__main__":
    main()
