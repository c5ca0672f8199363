"""tokenedge's own CPU kernels (`int4_amx.cpp`): 4-bit GGUF weights against activations quantized per row
and group in two int8 passes (`int4_mm`, the decoder's projections: AVX512-VNNI for 1-3 rows, AMX int8 tiles
from 4, the same integer sums), and int8 rows for the LM head's approximate logits (`int8_vnni` for 1-3 rows,
`int8_mm` on AMX bf16 tiles from 4).

Two builds of the one source (`build.isa()`, from the CPU's flags; `simd.h` holds the difference): the AVX512
build above (its AMX paths only where the CPU has AMX), and an AVX2 build (AVX2, FMA, F16C: an AMD EPYC before
Zen 4) whose `int4_mm` and `int8_vnni` serve every row count with vpmaddubsw, the same exact integer sums.
Either is "the 'amx' kernel" to its callers (`load.int4_kernel()`); the served `kernel_id` names the build.

Why: torch's `_weight_int4pack_mm_for_cpu` re-dequantizes the weights for every few rows, so its cost grows
with the rows (1.15x / 1.4x / 1.7x / 3x a one-row call at 2 / 3 / 4 / 8 rows, SmolLM2's shapes): continuous
batching hardly paid, and one row cost 5 ms over the 120 projections. Integer dot products of the codes as
stored (nibbles unpacked to bytes) with int8 inputs cost 3 ms for one row and 6.5 ms for 8 here. Each group's
sums are exact integers, so the two paths agree bitwise and every output element is one fixed sequence of
operations: batch-invariant by construction (see the .cpp). The inputs keep about 15 bits per group (two
int8 passes), finer than the bf16 they arrive in. The head's kernels only approximate: it rescores its
candidates exactly (backend.model.head.RescoredHead).

Built into the same library: `decoder_step.cpp`, a model's whole decoder stack over the same int4 core
(`int4_core.h`; backend/model/native_step.py), and `rescore.cpp`, the greedy head's exact pass over its candidates.

One module per job; callers import the module that owns the name (this package re-exports nothing):
`build` compiles the sources on the machine at hand and caches the library, `load` loads it, registers the ops
and decides whether they are used (the served `kernel_id`), `ops` packs weights and calls the ops.

    python -m backend.kernels       # build (if needed), self-check and print the kernel in use
"""
