"""Model loaders: GGUF files and safetensors checkpoint directories -> `LoadedModel`."""

from backend.loader.load import default_model_path, load_model
from backend.loader.loaded_model import LoadedModel

__all__ = ["LoadedModel", "default_model_path", "load_model"]
