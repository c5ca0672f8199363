"""What every loader returns: config, fp32 weights under Hugging Face Llama names, tokenizer, revision,
and the file's own 4-bit blocks where it has them (the fp32 weights are their exact dequantization)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from backend.loader.quantized import Int4Blocks
from backend.model.config import LlamaConfig
from backend.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A checkpoint in memory. `revision` changes whenever the weights or the config change."""

    name: str
    config: LlamaConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    revision: str
    chat_template: str | None
    quantized: dict[str, Int4Blocks] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "model.embed_tokens.weight" not in self.weights:
            raise ValueError(f"{self.name}: no embedding weight")
        if not self.config.tie_word_embeddings and "lm_head.weight" not in self.weights:
            raise ValueError(f"{self.name}: untied embeddings but no lm_head.weight")
        if self.tokenizer.vocab_size > self.config.vocab_size:
            raise ValueError(
                f"{self.name}: tokenizer has {self.tokenizer.vocab_size} ids, model only {self.config.vocab_size}"
            )
