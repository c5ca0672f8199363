"""`cache_salt` in the engine's prefix cache (backend/engine/block_pool.py `salt_root`): blocks a request computed
are reused by a later request with the same salt only, so one tenant's prompt never shortens another's prefill."""

from __future__ import annotations

import pytest
import torch

from backend.engine import kv_cache_manager
from backend.engine.block_pool import BlockPool
from backend.engine.kv_cache_manager import KVCacheManager
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Sequence

PROMPT = list(range(1, 18))  # 4 whole blocks of 4, and one token to compute


def manager() -> KVCacheManager:
    pool = BlockPool(16, 4, num_layers=1, num_kv_heads=1, head_dim=4, dtype=torch.float32, device="cpu")
    return KVCacheManager(pool, enable_prefix_caching=True)


def computed(kv: KVCacheManager, salt: str, name: str = "a") -> Sequence:
    """A sequence whose whole prompt was computed (its full blocks registered), then freed."""
    seq = Sequence(name, PROMPT, SamplingParams(cache_salt=salt))
    assert kv.allocate(seq, len(PROMPT))
    seq.num_computed_tokens = len(PROMPT)
    kv.cache_full_blocks(seq, 0)
    kv.free(seq)
    return seq


def matched(kv: KVCacheManager, salt: str) -> int:
    return kv.match_prefix(Sequence("next", PROMPT, SamplingParams(cache_salt=salt))).num_tokens


def test_a_salted_prefix_is_reused_under_its_salt_only() -> None:
    kv = manager()
    computed(kv, "tenant-a")
    assert matched(kv, "tenant-a") == 16  # the same tenant's next question reuses the whole prefix
    assert matched(kv, "tenant-b") == 0  # another tenant reuses none of it
    assert matched(kv, "") == 0  # nor does an unsalted request
    computed(kv, "", "public")
    assert matched(kv, "") == 16 and matched(kv, "tenant-b") == 0


def test_mutation_an_unsalted_root_shares_across_tenants(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_cache_manager, "salt_root", lambda salt: None)
    kv = manager()
    computed(kv, "tenant-a")
    assert matched(kv, "tenant-b") == 16  # what the salt prevents
