"""Llama-family model: config, layers and the forward pass that delegates attention to a paged backend."""

from backend.model.config import LlamaConfig
from backend.model.llama import LlamaModel

__all__ = ["LlamaConfig", "LlamaModel"]
