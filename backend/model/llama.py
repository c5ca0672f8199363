"""The Llama model: paged forward for the engine plus a plain full-recompute forward kept as the oracle.

`forward` takes the new tokens of a step (flattened across sequences) and a per-layer attention callback
that the engine binds to its KV pool and per-step context; the model never sees pages. `reference_logits`
recomputes a whole sequence with plain causal attention and no cache: tests compare the two.
The residual stream, final norm and logits are fp32 whatever the weight dtype (bf16 greedy decoding derails
on logit ties).
`invariant=True` (the engine's batch-invariant mode, docs/design.md §8) runs every linear and the LM head in
calibrated row tiles (backend/model/tiling.py); RoPE always comes from a per-position table.
`backend.model.quant.quantize_model` swaps the projections for int4/int8 kernels and sets `head`, a
greedy-exact quantized LM head used for the rows that decode greedily. Where every projection is on tokenedge's
int4 kernel, an engine step runs the decoder layers as one native call (backend/model/native_step.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn
from torch.nn import functional as F

from backend.model.config import LlamaConfig
from backend.model.layers import AttendFn, LlamaDecoderLayer, RMSNorm
from backend.model.native_step import NativeStack, PagedStep, build_native
from backend.model.rope import RopeTable, inv_frequencies
from backend.model.tiling import Calibrate, RowTiling, TilingMemo, calibrate_tiling, tiled_rows

if TYPE_CHECKING:
    from backend.model.tiling_store import TilingStore


class GreedyHead(Protocol):
    """A quantized LM head whose greedy rows pick the fp32 head's token (`backend.model.head.RescoredHead`)."""

    def greedy_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


# (layer index, q [T, H, D], k [T, KH, D], v [T, KH, D]) -> [T, H, D]
LayerAttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_LOG = logging.getLogger(__name__)


class LlamaModel(nn.Module):
    def __init__(
        self, config: LlamaConfig, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"
    ) -> None:
        super().__init__()
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"unsupported weight dtype {dtype}")
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, dtype, device) for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(
                config.hidden_size, config.vocab_size, bias=False, dtype=dtype, device=device
            )
            self.lm_head.weight.requires_grad_(False)
        # inv_freq: [D/2] fp32, a plain attribute (not a parameter: never loaded)
        self.inv_freq = inv_frequencies(config.head_dim, config.rope_theta, config.rope_scaling).to(device)
        self.rope = RopeTable(config.max_position_embeddings, self.inv_freq)
        self._head_tiling: RowTiling | None = None
        # fp32 logits: an fp32 copy of the output matrix when the weights are half precision.
        self._logits_weight_fp32: torch.Tensor | None = None
        self.head: GreedyHead | None = None  # set by quantize_model
        # (stack key, the native layers or None where they cannot run), see native_step.py; the key: `_revision`
        # (moved by every change of projections or weights) and the norm weights' versions
        self._native: tuple[tuple[int, ...], NativeStack | None] | None = None
        self._revision = 0
        self._norm_weights = [n.weight for layer in self.layers for n in _norms(layer)]

    # ---- weights -------------------------------------------------------------------------------------

    def _hf_parameters(self) -> dict[str, torch.Tensor]:
        """Each Hugging Face weight name -> the parameter (or the rows of a fused parameter) it fills."""
        c = self.config
        params: dict[str, torch.Tensor] = {
            "model.embed_tokens.weight": self.embed_tokens.weight,
            "model.norm.weight": self.norm.weight,
        }
        if self.lm_head is not None:
            params["lm_head.weight"] = self.lm_head.weight
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, LlamaDecoderLayer)
            p = f"model.layers.{i}."
            q, k, v = layer.self_attn.qkv_proj.weight.split([c.q_size, c.kv_size, c.kv_size])
            gate, up = layer.mlp.gate_up_proj.weight.chunk(2)
            params |= {
                p + "input_layernorm.weight": layer.input_layernorm.weight,
                p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
                p + "self_attn.q_proj.weight": q,
                p + "self_attn.k_proj.weight": k,
                p + "self_attn.v_proj.weight": v,
                p + "self_attn.o_proj.weight": layer.self_attn.o_proj.weight,
                p + "mlp.gate_proj.weight": gate,
                p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": layer.mlp.down_proj.weight,
            }
        return params

    @torch.no_grad()
    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy Hugging Face-named tensors (any float dtype) into the model; every parameter is required."""
        params = self._hf_parameters()
        unexpected = [
            name
            for name in weights
            if name not in params
            and not name.endswith(_IGNORED_SUFFIXES)
            and not (name == "lm_head.weight" and self.config.tie_word_embeddings)
        ]
        if unexpected:
            raise ValueError(f"unexpected weights: {sorted(unexpected)[:8]}")
        missing = [name for name in params if name not in weights]
        if missing:
            raise ValueError(f"missing weights: {sorted(missing)[:8]}")
        for name, param in params.items():
            tensor = weights[name]
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != expected {tuple(param.shape)}")
            param.copy_(tensor.to(device=param.device, dtype=param.dtype))
        self._logits_weight_fp32 = None
        if self.dtype != torch.float32:
            self._logits_weight_fp32 = self._output_weight().float()
        self.projections_changed()

    def projections_changed(self) -> None:
        """Weights or projection modules changed (load_weights, quantize_model): re-calibrate, re-script."""
        self._head_tiling = None
        self._revision += 1

    def calibrate_invariance(
        self, store: TilingStore | None = None, measure: Calibrate = calibrate_tiling
    ) -> None:
        """Measure the row tiling of every linear shape and the LM head (once; backend/model/tiling.py), or
        read them from `store` where an earlier start under the same context measured them (and store what
        had to be measured)."""
        if self._head_tiling is not None:
            return
        start = time.perf_counter()
        memo: TilingMemo = store.load() if store is not None else {}
        known = set(memo)
        for layer in self.layers:
            assert isinstance(layer, LlamaDecoderLayer)
            for linear in layer.linears():
                linear.calibrate(memo, measure)
        head = (self.config.vocab_size, self.config.hidden_size, "lm_head-float32")
        if head not in memo:
            memo[head] = measure(self._head_matmul, self.config.hidden_size, torch.float32, self.device)
        self._head_tiling = memo[head]
        self._revision += 1
        measured = set(memo) - known
        if store is not None and measured:
            store.save(memo)
        _LOG.info(
            "batch-invariant row tilings: %d shapes measured, %d from the cache, in %.1f s: %s",
            len(measured),
            len(memo) - len(measured),
            time.perf_counter() - start,
            self.tilings,
        )

    @property
    def tilings(self) -> dict[str, RowTiling]:
        """The calibrated tiling per linear (first layer) and the LM head, for logs and benchmarks."""
        first = self.layers[0]
        assert isinstance(first, LlamaDecoderLayer) and self._head_tiling is not None
        names = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
        found = {n: lin.tiling for n, lin in zip(names, first.linears(), strict=True)}
        return {n: t for n, t in found.items() if t is not None} | {"lm_head": self._head_tiling}

    def _output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def output_weight_fp32(self) -> torch.Tensor:
        """[V, hidden] fp32, the matrix the exact logits use."""
        return self._logits_weight_fp32 if self._logits_weight_fp32 is not None else self._output_weight()

    # ---- forward -------------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: LayerAttendFn,
        invariant: bool = False,
        step: PagedStep | None = None,
    ) -> torch.Tensor:
        """Hidden states after the final norm, fp32 [T, hidden], for the flattened new tokens of a step.
        With `step` (the engine's pool and context) and a native stack the layers run as one native call
        (backend/model/native_step.py), through `attend` otherwise."""
        # token_ids, positions: [T] int64
        assert token_ids.dim() == 1 and token_ids.shape == positions.shape
        if invariant:
            self.calibrate_invariance()
        cos, sin = self.rope.lookup(positions, self.config.rope_interleaved)  # [T, 1, D/2 or D] each
        x = self.embed_tokens(token_ids).float()  # x: [T, hidden] fp32 residual
        stack = self.native_stack() if step is not None else None
        if stack is not None and step is not None:
            x = stack.run(x, cos, sin, step)
        else:
            for index, layer in enumerate(self.layers):
                assert isinstance(layer, LlamaDecoderLayer)
                x = layer.forward(
                    x, cos, sin, _bind_layer(attend, index), invariant
                )  # no hooks: skip __call__
        return self.norm.forward(x)  # [T, hidden] fp32

    def native_stack(self) -> NativeStack | None:
        """The layers as the native step takes them (None: they run eagerly), rebuilt when a projection or a
        norm weight changed."""
        key = (self._revision, *(w._version for w in self._norm_weights))
        if self._native is None or self._native[0] != key:
            # the step reads and writes the pool in bf16, the dtype the quantized kernels produce
            native = self.device.type == "cpu" and self.dtype == torch.bfloat16
            stack = build_native(list(self.layers), self.config) if native else None
            self._native = (key, stack)
        return self._native[1]

    @torch.inference_mode()
    def compute_logits(
        self, hidden: torch.Tensor, invariant: bool = False, greedy: Seq[bool] | None = None
    ) -> torch.Tensor:
        """fp32 logits [N, vocab]. With a quantized head, rows flagged `greedy` get greedy-exact logits
        (their argmax is the fp32 head's whatever the batch; see `RescoredHead`), the others the fp32 head."""
        # hidden: [N, hidden] fp32 -> logits: [N, vocab] fp32
        hidden = hidden.float()
        if self.head is None or greedy is None or not any(greedy):
            return self._dense_logits(hidden, invariant)
        logits = self.head.greedy_logits(hidden)  # [N, vocab]
        sampled = [i for i, g in enumerate(greedy) if not g]
        if sampled:
            logits[sampled] = self._dense_logits(hidden[sampled], invariant)
        return logits

    def _dense_logits(self, hidden: torch.Tensor, invariant: bool) -> torch.Tensor:
        if not invariant:
            return self._head_matmul(hidden)
        self.calibrate_invariance()
        assert self._head_tiling is not None
        return tiled_rows(self._head_matmul, hidden, self._head_tiling)

    def _head_matmul(self, rows: torch.Tensor) -> torch.Tensor:
        # rows: [M, hidden] fp32 -> [M, vocab] fp32
        return F.linear(rows, self.output_weight_fp32())

    @torch.inference_mode()
    def reference_logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Test oracle: plain causal attention over the whole sequence, no KV cache. [T, vocab] fp32."""
        token_ids = token_ids.to(self.device)
        positions = torch.arange(token_ids.shape[0], device=self.device)
        hidden = self.forward(token_ids, positions, lambda _layer, q, k, v: _causal_attention(q, k, v))
        return self.compute_logits(hidden)


def _norms(layer: nn.Module) -> tuple[RMSNorm, RMSNorm]:
    assert isinstance(layer, LlamaDecoderLayer)
    return layer.input_layernorm, layer.post_attention_layernorm


def _bind_layer(attend: LayerAttendFn, index: int) -> AttendFn:
    return lambda q, k, v: attend(index, q, k, v)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # q: [T, H, D]; k, v: [T, KH, D] -> [T, H, D]
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # [T, H, D]
    v = v.repeat_interleave(group, dim=1)  # [T, H, D]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    )  # [H, T, D]
    return out.transpose(0, 1)
