"""The backend tokenizer: the model's own byte-level BPE as a tiktoken Encoding, and its chat template."""

from backend.tokenizer.sources import tokenizer_from_gguf_metadata, tokenizer_from_hf_dir
from backend.tokenizer.tokenizer import Tokenizer
from tokenedge_wire.chat_template import ChatTemplateError

__all__ = ["ChatTemplateError", "Tokenizer", "tokenizer_from_gguf_metadata", "tokenizer_from_hf_dir"]
