"""Paged attention backends behind one interface; all share the KV layout [num_blocks, block_size, KH, D]."""

from backend.attention.backend import AttentionBackend, write_kv
from backend.attention.context import AttentionContext
from backend.attention.selector import default_block_size, make_attention_backend, resolve_attention

__all__ = [
    "AttentionBackend",
    "AttentionContext",
    "default_block_size",
    "make_attention_backend",
    "resolve_attention",
    "write_kv",
]
