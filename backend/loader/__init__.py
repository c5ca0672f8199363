"""Model loaders: GGUF files and safetensors checkpoint directories -> `LoadedModel`."""

from backend.loader.gguf_loader import gguf_tokenizer
from backend.loader.load import default_model_path, load_model
from backend.loader.loaded_model import LoadedModel

__all__ = ["LoadedModel", "default_model_path", "gguf_tokenizer", "load_model"]
