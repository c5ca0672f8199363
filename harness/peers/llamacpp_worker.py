"""Runs inside the llama.cpp bench venv (never imported by tokenedge): one llama.cpp model driven over
stdin/stdout JSON lines, so `bench backend_hf` can alternate it with our engine round by round.

Commands: {"op": "batch1", "ids": [...], "n": N} -> decode tok/s after the first token (EOS ignored);
{"op": "prefill", "ids": [...]} -> prompt tok/s; {"op": "argmax", "ids": [...]} -> teacher-forced top-1 ids.
"""

import json
import sys
import time

import llama_cpp


def main() -> None:
    path, threads = sys.argv[1], int(sys.argv[2])
    llm = llama_cpp.Llama(
        model_path=path,
        n_threads=threads,
        n_threads_batch=threads,
        n_ctx=2048,
        n_batch=512,
        logits_all=True,
        verbose=False,
    )
    print(
        json.dumps({"ready": True, "system_info": llama_cpp.llama_print_system_info().decode()}), flush=True
    )
    for line in sys.stdin:
        cmd = json.loads(line)
        llm.reset()
        if cmd["op"] == "batch1":
            llm.eval(cmd["ids"])
            first = time.perf_counter()
            for _ in range(cmd["n"] - 1):
                token = int(llm.scores[llm.n_tokens - 1].argmax())
                llm.eval([token])
            result = (cmd["n"] - 1) / (time.perf_counter() - first)
        elif cmd["op"] == "prefill":
            start = time.perf_counter()
            llm.eval(cmd["ids"])
            result = len(cmd["ids"]) / (time.perf_counter() - start)
        else:
            llm.eval(cmd["ids"])
            result = [int(i) for i in llm.scores[: len(cmd["ids"])].argmax(axis=1)]
        print(json.dumps({"result": result}), flush=True)


if __name__ == "__main__":
    main()
