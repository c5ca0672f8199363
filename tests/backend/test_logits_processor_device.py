"""backend/engine/logits_processor.py on logits that are not on the CPU: every tensor a processor makes must be on
the logits' device (CUDA refuses a CPU operand that is not zero-dimensional, so penalties, `logit_bias`, `min_tokens`
and grammars crashed there). Checked without a GPU: the logits live on the `meta` device and a dispatch mode fails
any op that mixes devices (stricter than CUDA, which lets an index live on the CPU); the mutation check drops the
device from the processor's tensors and sees the test fail."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from backend.engine import logits_processor
from backend.engine.logits_processor import process_logits
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence

EOS, VOCAB = 0, 8
EVERYTHING = SamplingParams(
    repetition_penalty=1.3,
    frequency_penalty=0.5,
    presence_penalty=0.25,
    logit_bias=((1, -100.0), (2, 3.5)),
    min_tokens=5,
    max_tokens=8,
    stop_token_ids=frozenset({7}),
)


class OneDevice(TorchDispatchMode):
    """Fails any op whose tensor operands (zero-dimensional ones aside) sit on more than one device."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        leaves = tree_leaves((args, kwargs or {}))
        devices = {t.device for t in leaves if isinstance(t, torch.Tensor) and t.dim() > 0}
        if len(devices) > 1:
            raise AssertionError(f"{func} mixes devices {sorted(map(str, devices))}")
        return func(*args, **(kwargs or {}))


class Grammar:
    """A matcher stand-in: the allowed set is a CPU mask, as llguidance's is."""

    def __init__(self, allowed: list[int]) -> None:
        self.mask = torch.zeros(VOCAB, dtype=torch.bool)
        self.mask[allowed] = True

    def allowed(self, vocab_size: int) -> torch.Tensor:
        return self.mask[:vocab_size]


def seq_with(params: SamplingParams, output: list[int], grammar: Grammar | None = None) -> Sequence:
    seq = Sequence("r", [3, 4], params)
    seq.token_ids.extend(output)
    seq.matcher = grammar  # type: ignore[assignment]
    return seq


def run_on(device: str) -> torch.Tensor:
    logits = torch.arange(2 * VOCAB, dtype=torch.float32).view(2, VOCAB).to(device)  # [2, vocab]
    seqs = [seq_with(EVERYTHING, [5, 5, 6], Grammar([0, 2, 5, 6])), seq_with(EVERYTHING, [2], Grammar([]))]
    with OneDevice():
        process_logits(logits, seqs, frozenset({EOS}))
    return logits


def test_every_processor_keeps_to_the_logits_device() -> None:
    assert run_on("meta").device.type == "meta"


def test_the_checker_sees_a_mixed_op() -> None:
    with OneDevice(), pytest.raises(AssertionError, match="mixes devices"):
        torch.zeros(3, device="meta") + torch.ones(3)


class _CpuTensors:
    """`torch` as the processor sees it, with `torch.tensor` dropping the device: the crash as it was."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def tensor(data: Any, **kwargs: Any) -> torch.Tensor:
        kwargs.pop("device", None)
        return torch.tensor(data, **kwargs)


def test_mutation_tensors_made_on_the_cpu_fail_the_device_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logits_processor, "torch", _CpuTensors())
    with pytest.raises(AssertionError, match="mixes devices"):
        run_on("meta")


def test_on_the_cpu_the_values_are_the_formulas() -> None:
    """The same step on real numbers: the grammar's row keeps its allowed tokens (EOS and the stop token banned
    by min_tokens), and the row whose grammar allows nothing becomes EOS alone."""
    first, second = run_on("cpu").tolist()
    assert [i for i, x in enumerate(first) if x != -math.inf] == [2, 5, 6]
    # token 5: seen (1.3 divides 5.0), counted twice (-1.0) and present (-0.25)
    assert first[5] == pytest.approx(5.0 / 1.3 - 2 * 0.5 - 0.25)
    assert first[2] == pytest.approx(2.0 + 3.5)  # unseen, biased
    assert second == [0.0] + [-math.inf] * (VOCAB - 1)
