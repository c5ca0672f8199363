// tokenedge's CPU kernels: 4-bit GGUF weights against activations quantized per row and group in two int8
// passes (`int4_mm`), and int8 rows for the LM head's approximate logits (`int8_mm`, `int8_vnni`).
//
// int4_mm: y = x @ W.T, w[n, k] = (q[n, k] - 8) * scale[n, g] + zero[n, g] with g = k / 32. Each group of 32
// inputs of a row is quantized on its own: x ~= s1 * a1 + s2 * a2, a1 = round(x / s1) with s1 = max|x| / 127,
// a2 = round((x - s1 * a1) / s2) with s2 = s1 / 254 (about 15 bits of each input, finer than bf16's 8). The
// products of codes and int8 inputs sum exactly in int32, so a group's sums S1 = sum a1 * q and S2 =
// sum a2 * q do not depend on who computed them or in what order: AVX512-VNNI (vpdpbusd) for a few rows, AMX
// int8 tiles (tdpbsud) for many, the same integers; in the AVX2 build (build.py: a CPU without AVX512-VNNI)
// vpmaddubsw and vpmaddwd for every row count, the same integers again (int4_core.h: group_sums). Then, in
// one fixed order per output element and group:
//   dot = s1 * S1 + s2 * S2, xs = s1 * A1 + s2 * A2 (A = sum of the a's), out += scale * dot, out += zp * xs,
// with zp = zero - 8 * scale (scale and zp in fp16: Q4_1's d and m, Q4_0's d and -8d, exactly). So every
// output element is the same arithmetic on its own row and column whatever the rows in the call, their order,
// the path, the column blocking or the threads: batch-invariant by construction (tests/backend/test_int4_kernel.py
// checks it bitwise across the paths).
//
// Everything AMX (the tiles' configuration, the int4 and int8 tile products) is compiled only where the compiler
// is given AMX (__AMX_TILE__, the AVX512 build); the AVX2 build registers the same ops, and those that need
// tiles (int8_mm, tile_config_roundtrip) refuse with a reason.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#if defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "int4_core.h"
#include "team.h"

namespace {

using namespace te;

constexpr int64_t kInt8GroupBytes = kTileRows * kLanes * 2;  // one B tile of int8 codes: 16 k-pairs x 16 x 2

#if defined(__AMX_TILE__)

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads exactly 64 bytes");

// ldtilecfg and sttilecfg with the whole 64-byte struct as their memory operand. Not GCC 12's intrinsics
// (amxtileintrin.h): they name an 8-byte operand, *(void**)cfg, so the compiler may delete the stores that
// fill the other 56 bytes and ldtilecfg faults on the stale stack bytes (docs/design.md §8; llama.cpp's
// ggml-cpu/amx/mmq.cpp had the same crash). Naming the struct keeps every store before the load.
inline void load_tile_config(const TileConfig& cfg) { __asm__ volatile("ldtilecfg %0" ::"m"(cfg)); }
inline void store_tile_config(TileConfig& cfg) { __asm__ volatile("sttilecfg %0" : "=m"(cfg)); }

// Tile loads and stores, ordered against the vector code around them. GCC 12's _tile_loadd and _tile_stored
// pass only the address ("r"), with no memory operand and no "memory" clobber, so as far as the compiler knows
// tileloadd reads no memory and tilestored writes none: it may sink the stores that fill a B tile past the load,
// or hoist the reads of a stored C tile above the store. A compiler barrier on the memory side of each (no
// instruction) keeps them in program order; the asm statements themselves, all volatile, keep theirs.
#define TE_TILE_LOAD(t, base, stride) \
  do {                                \
    __asm__ volatile("" ::: "memory"); \
    _tile_loadd(t, base, stride);     \
  } while (0)
#define TE_TILE_STORE(t, base, stride) \
  do {                                 \
    _tile_stored(t, base, stride);     \
    __asm__ volatile("" ::: "memory"); \
  } while (0)

// tiles 0..5 as (rows, bytes per row): C and A of `rows` rows, B of `b_rows` rows of 64 bytes
void configure(int rows, int a_bytes, int b_rows) {
  TileConfig cfg;
  for (int t : {0, 1}) {
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[t] = 64;
  }
  for (int t : {2, 3}) {
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[t] = static_cast<uint16_t>(a_bytes);
  }
  for (int t : {4, 5}) {
    cfg.rows[t] = static_cast<uint8_t>(b_rows);
    cfg.colsb[t] = 64;
  }
  load_tile_config(cfg);
}


constexpr int64_t kRing = 4;   // streamed B tiles: unpacked kAhead groups ahead of their product
constexpr int64_t kAhead = 2;
constexpr int64_t kBTile = kQuads * 64;  // bytes of one group's B tile

inline void unpack_b(const Panel& p, int64_t b, int64_t g, uint8_t* dst) {
  const uint8_t* src = p.codes + (b * p.groups + g) * kGroupBytes;
  for (int64_t j = 0; j < kQuads; ++j) _mm512_storeu_si512(dst + j * 64, quad_codes(src + j * kQuadBytes));
}

// product of group g on a tile set (C 0, A 2, B 4 or C 1, A 3, B 5): A's 2 * rows rows are the rows' two
// passes, interleaved, so C's row 2i holds S1 and row 2i + 1 S2 of row i. Streamed: B of group g + kAhead is
// unpacked first, into the ring.
#define TE_PRODUCT(C, A, B, g)                                                                   \
  if (stream && (g) + kAhead < p.groups) unpack_b(p, b, (g) + kAhead, bt + (((g) + kAhead) % kRing) * kBTile); \
  _tile_zero(C);                                                                                \
  TE_TILE_LOAD(A, xa + (g) * kGroup, x.k);                                                      \
  TE_TILE_LOAD(B, bt + (stream ? (g) % kRing : (g)) * kBTile, 64);                              \
  _tile_dpbsud(C, A, B)

// up to 8 rows (one A tile of both passes) against block b, B streamed or unpacked whole in bt; the groups'
// products alternate between two tile sets, each folded while the next one runs
template <bool stream, int kPlanes>
void amx_rows(const Panel& p, int64_t b, const Quantized& x, int64_t r0, int rows, uint8_t* bt, uint16_t* y,
              int64_t ldy) {
  alignas(64) int32_t c[2][kTileRows * kLanes];
  const int8_t* xa = x.a + r0 * 2 * x.k;
  F32x16 out[kAmxRows];
  for (int r = 0; r < rows; ++r) out[r] = _mm512_setzero_ps();
  if (stream)
    for (int64_t g = 0; g < std::min(kAhead, p.groups); ++g) unpack_b(p, b, g, bt + g * kBTile);
  TE_PRODUCT(0, 2, 4, 0);
  for (int64_t g = 0; g < p.groups; ++g) {
    const int t = static_cast<int>(g & 1);
    if (g + 1 < p.groups) {
      if (t == 0) {
        TE_PRODUCT(1, 3, 5, g + 1);
      } else {
        TE_PRODUCT(0, 2, 4, g + 1);
      }
    }
    if (t == 0) {
      TE_TILE_STORE(0, c[0], 64);
    } else {
      TE_TILE_STORE(1, c[1], 64);
    }
    for (int r = 0; r < rows; ++r) {
      const int64_t row = r0 + r;
      out[r] = fold<kPlanes>(out[r], _mm512_load_si512(c[t] + 2 * r * kLanes),
                             _mm512_load_si512(c[t] + (2 * r + 1) * kLanes), x.s + (row * p.groups + g) * 2,
                             x.xs[row * p.groups + g], p.scales(b, g));
    }
  }
  for (int r = 0; r < rows; ++r) store_row(out[r], y + (r0 + r) * ldy + b * kLanes);
}

// many rows against block b: streamed for one row tile, else the block's B tiles unpacked once and shared
void amx_block(const Panel& p, int64_t b, const Quantized& x, int64_t m, std::vector<uint8_t>& bt, uint16_t* y,
               int64_t ldy, int& configured) {
  bt.resize(std::max(p.groups, kRing) * kBTile);
  if (m > kAmxRows)
    for (int64_t g = 0; g < p.groups; ++g) unpack_b(p, b, g, bt.data() + g * kBTile);
  for (int64_t r0 = 0; r0 < m; r0 += kAmxRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kAmxRows, m - r0));
    if (rows != configured) configure(2 * (configured = rows), kGroup, kQuads);
    const bool one = p.planes == 1;
    if (m > kAmxRows) {
      (one ? amx_rows<false, 1> : amx_rows<false, 2>)(p, b, x, r0, rows, bt.data(), y, ldy);
    } else {
      (one ? amx_rows<true, 1> : amx_rows<true, 2>)(p, b, x, r0, rows, bt.data(), y, ldy);
    }
  }
}

bool amx_permitted() {
  static const bool ok = [] {
    constexpr int kReqPerm = 0x1023, kXtiledata = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kReqPerm, kXtiledata) == 0;
  }();
  return ok;
}

#else

constexpr bool amx_permitted() { return false; }

#endif

at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& factors) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x: [M, K] bf16, contiguous");
  TORCH_CHECK(codes.dim() == 4 && codes.scalar_type() == at::kByte && codes.is_contiguous() &&
                  codes.size(2) == kQuads && codes.size(3) == kQuadBytes, "codes: [N / 16, K / 32, 8, 32] uint8");
  const int64_t m = x.size(0), k = x.size(1), blocks = codes.size(0), groups = codes.size(1);
  TORCH_CHECK(factors.scalar_type() == at::kHalf && factors.is_contiguous() && factors.dim() == 4 &&
                  factors.size(0) == blocks && factors.size(1) == groups && factors.size(3) == kLanes &&
                  (factors.size(2) == 1 || factors.size(2) == 2),
              "factors: [N / 16, K / 32, 2, 16] fp16 (scales, zero points), or [N / 16, K / 32, 1, 16] (scales)");
  TORCH_CHECK(k == groups * kGroup, "x has ", k, " columns, the weight ", groups * kGroup);
  // AMX where the build and the CPU have it and the OS grants its tiles, else VNNI (or AVX2) for every row
  // count: the same sums
  const bool amx = m >= kAmxFrom && amx_permitted();
  at::Tensor y = at::empty({m, blocks * kLanes}, x.options());
  if (m == 0) return y;
  at::Tensor a = at::empty({m, 2, k}, x.options().dtype(at::kChar));
  at::Tensor s = at::empty({m, groups, 3}, x.options().dtype(at::kFloat));  // s1, s2 per group, then xs
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  int8_t* ap = a.data_ptr<int8_t>();
  float* sp = s.data_ptr<float>();
  float* xsp = sp + m * groups * 2;
  for (int64_t r = 0; r < m; ++r)
    quantize_row(xp + r * k, groups, ap + r * 2 * k, ap + (r * 2 + 1) * k, sp + r * groups * 2, xsp + r * groups);
  const Quantized q{ap, sp, xsp, k, groups};
  const Panel p{codes.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(factors.data_ptr()), groups,
                factors.size(2)};
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    if (!amx) {
      vnni_blocks(p, q, m, begin, end, yp, blocks * kLanes);
      return;
    }
#if defined(__AMX_TILE__)
    thread_local std::vector<uint8_t> bt;
    int configured = 0;
    for (int64_t b = begin; b < end; ++b) amx_block(p, b, q, m, bt, yp, blocks * kLanes, configured);
    _tile_release();
#endif
  });
  return y;
}

#if defined(__AMX_TILE__)

constexpr int64_t kTileWords = kTileRows * kGroup;  // bf16 words in one B tile of the int8 head

// the int8 head's AMX tiles: C 0, 1, A 2, 3, B 4, 5 (16 k-pairs of 64 bytes)
void configure(int rows) { configure(rows, 64, kTileRows); }

// ---- int8 rows for the LM head's approximate logits: y[m, n] = scale[n] * sum_k x[m, k] * code[n, k] ----
// Codes (-127..127) are exact in bf16; sums accumulate in fp32 across all of K in two tiles (even and odd
// groups) added at the end. Only an approximation (backend.model.quant.RescoredHead rescores every candidate
// exactly), so its summation order is free; its error is fp32 accumulation, inside the head's bound.

// a block's int8 codes as bf16 B tiles, every group of the block
void unpack_int8(const int8_t* codes, int64_t groups, uint16_t* out) {
  for (int64_t t = 0; t < groups * kTileRows; ++t) {  // one 64-byte tile row: 16 columns x (k, k + 1)
    const int8_t* src = codes + t * kLanes * 2;
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
    __m512 hi =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16))));
    _mm512_storeu_si512(out + t * 32, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));  // words 0..15: lo, 16..31: hi
  }
}

void int8_span(const int8_t* codes, const float* scales, int64_t groups, int64_t begin, int64_t end,
               const uint16_t* x, int64_t m, int64_t k, float* y, int64_t ldy) {
  thread_local std::vector<uint16_t> b;
  b.resize(groups * kTileWords);
  alignas(64) float c0[kTileRows * kLanes], c1[kTileRows * kLanes];
  int configured = 0;
  for (int64_t blk = begin; blk < end; ++blk) {
    unpack_int8(codes + blk * groups * kInt8GroupBytes, groups, b.data());
    const __m512 scale = _mm512_loadu_ps(scales + blk * kLanes);
    for (int64_t r = 0; r < m; r += kTileRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kTileRows, m - r));
      if (rows != configured) configure(configured = rows);
      const uint16_t* xr = x + r * k;
      _tile_zero(0);
      _tile_zero(1);
      int64_t g = 0;
      for (; g + 1 < groups; g += 2) {
        TE_TILE_LOAD(2, xr + g * kGroup, k * 2);
        TE_TILE_LOAD(4, b.data() + g * kTileWords, 64);
        _tile_dpbf16ps(0, 2, 4);
        TE_TILE_LOAD(3, xr + (g + 1) * kGroup, k * 2);
        TE_TILE_LOAD(5, b.data() + (g + 1) * kTileWords, 64);
        _tile_dpbf16ps(1, 3, 5);
      }
      if (g < groups) {
        TE_TILE_LOAD(2, xr + g * kGroup, k * 2);
        TE_TILE_LOAD(4, b.data() + g * kTileWords, 64);
        _tile_dpbf16ps(0, 2, 4);
      }
      TE_TILE_STORE(0, c0, 64);
      TE_TILE_STORE(1, c1, 64);
      for (int i = 0; i < rows; ++i)
        _mm512_storeu_ps(y + (r + i) * ldy + blk * kLanes,
                         _mm512_mul_ps(scale, _mm512_add_ps(_mm512_load_ps(c0 + i * kLanes),
                                                            _mm512_load_ps(c1 + i * kLanes))));
    }
  }
  _tile_release();
}

#endif

at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
#if !defined(__AMX_TILE__)
  TORCH_CHECK(false, "int8_mm needs AMX: this is the kernel library's AVX2 build (use int8_vnni)");
  return at::Tensor();
#else
  TORCH_CHECK(amx_permitted(), "the kernel needs AMX tiles and the OS refused them");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x: [M, K] bf16, contiguous");
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == at::kChar && codes.is_contiguous() &&
                  codes.size(2) == kInt8GroupBytes, "codes: [N / 16, K / 32, 512] int8");
  const int64_t m = x.size(0), k = x.size(1), blocks = codes.size(0), groups = codes.size(1);
  TORCH_CHECK(k == groups * kGroup, "x has ", k, " columns, the weight ", groups * kGroup);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.numel() == blocks * kLanes,
              "scales: [N] fp32");
  at::Tensor y = at::empty({m, blocks * kLanes}, x.options().dtype(at::kFloat));
  if (m == 0) return y;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const int8_t* cp = codes.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, blocks, 16, [&](int64_t begin, int64_t end) {
    int8_span(cp, sp, groups, begin, end, xp, m, k, yp, blocks * kLanes);
  });
  return y;
#endif
}

// ---- int8 rows against a few activation rows on AVX512-VNNI (or AVX2), for the LM head's approximate logits
// at 1..3 rows (at every row count without AMX):
// y[m, n] = scales[n] * sum_p row_scales[m, p] * (sum_k u[m, p, k] * code[n, k] - 128 * colsum[n]),
// where u[m, p] = q[m, p] + 128 are the two int8 passes of the row (the value, then its residual) offset to
// unsigned. Integer sums are exact, so the blocking is free. ----

constexpr int64_t kQuad = 4;  // k per VNNI lane step: codes [N/16, K/4, 16 x 4]; one step: simd.h's head_dot

void vnni_span(const int8_t* codes, const int32_t* colsum, const float* scales, int64_t quads, int64_t begin,
               int64_t end, const uint8_t* u, const float* row_scales, int64_t m, float* y, int64_t ldy) {
  for (int64_t blk = begin; blk < end; ++blk) {
    const int8_t* w = codes + blk * quads * kLanes * kQuad;
    const F32x16 cs = to_float(load_i(colsum + blk * kLanes));
    const F32x16 sc = loadu(scales + blk * kLanes);
    for (int64_t r = 0; r < m; ++r) {
      const int32_t* u0 = reinterpret_cast<const int32_t*>(u + r * 2 * quads * kQuad);
      const int32_t* u1 = u0 + quads;
      I32x16 a0 = zero_i(), a1 = a0, b0 = a0, b1 = a0;  // two chains per pass
      int64_t q = 0;
      for (; q + 1 < quads; q += 2) {
        if (r == 0) {  // the same 128 bytes two blocks on, into L2: one row's pass waits on memory
          _mm_prefetch(reinterpret_cast<const char*>(w + (2 * quads + q) * 64), _MM_HINT_T1);
          _mm_prefetch(reinterpret_cast<const char*>(w + (2 * quads + q + 1) * 64), _MM_HINT_T1);
        }
        const I32x16 w0 = load_i(w + q * 64), w1 = load_i(w + (q + 1) * 64);
        a0 = head_dot(a0, u0[q], w0);
        b0 = head_dot(b0, u1[q], w0);
        a1 = head_dot(a1, u0[q + 1], w1);
        b1 = head_dot(b1, u1[q + 1], w1);
      }
      if (q < quads) {
        const I32x16 w0 = load_i(w + q * 64);
        a0 = head_dot(a0, u0[q], w0);
        b0 = head_dot(b0, u1[q], w0);
      }
      F32x16 d0 = to_float(add(a0, a1)), d1 = to_float(add(b0, b1));
      if (kHeadOffset) {
        const F32x16 off = mul(splat(128.0f), cs);
        d0 = sub(d0, off);
        d1 = sub(d1, off);
      }
      const F32x16 v = fmadd(splat(row_scales[r * 2]), d0, mul(splat(row_scales[r * 2 + 1]), d1));
      storeu(y + r * ldy + blk * kLanes, mul(sc, v));
    }
  }
}

at::Tensor int8_vnni(const at::Tensor& u, const at::Tensor& row_scales, const at::Tensor& codes,
                     const at::Tensor& colsum, const at::Tensor& scales) {
  TORCH_CHECK(u.dim() == 3 && u.size(1) == 2 && u.scalar_type() == at::kByte && u.is_contiguous(),
              "u: [M, 2, K] uint8");
  TORCH_CHECK(row_scales.scalar_type() == at::kFloat && row_scales.is_contiguous() &&
                  row_scales.numel() == u.size(0) * 2, "row_scales: [M, 2] fp32");
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == at::kChar && codes.is_contiguous() &&
                  codes.size(2) == kLanes * kQuad, "codes: [N / 16, K / 4, 64] int8");
  const int64_t m = u.size(0), k = u.size(2), blocks = codes.size(0), quads = codes.size(1);
  TORCH_CHECK(k == quads * kQuad, "u has ", k, " columns, the weight ", quads * kQuad);
  TORCH_CHECK(colsum.scalar_type() == at::kInt && colsum.is_contiguous() && colsum.numel() == blocks * kLanes,
              "colsum: [N] int32");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.numel() == blocks * kLanes,
              "scales: [N] fp32");
  at::Tensor y = at::empty({m, blocks * kLanes}, u.options().dtype(at::kFloat));
  if (m == 0) return y;
  const int8_t* cp = codes.data_ptr<int8_t>();
  const int32_t* csp = colsum.data_ptr<int32_t>();
  const float* sp = scales.data_ptr<float>();
  const uint8_t* up = u.data_ptr<uint8_t>();
  const float* rs = row_scales.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const auto span = [&](int64_t begin, int64_t end) {
    vnni_span(cp, csp, sp, quads, begin, end, up, rs, m, yp, blocks * kLanes);
  };
  // the blocking never changes a sum. Fork: a few rows on the calling thread alone, as the decoder step's
  // (decoder_step.cpp: kParallelTokens); a pool: its team at every row count; region: one fork/join
  const int threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  switch (threading_mode()) {
    case Threading::kFork:
      at::parallel_for(0, blocks, m >= 16 ? 64 : blocks, span);
      break;
    case Threading::kPool:
      if (threads > 1)
        pool_team(threads).run(blocks, 16, threads, span);
      else
        span(0, blocks);
      break;
    case Threading::kRegion:
      at::parallel_for(0, blocks, 64, span);
      break;
  }
  return y;
}

// ---- a debug entry for tests: the tile configuration `configure` loads, read back from the CPU ----
// configure(rows, a_bytes, b_rows), then sttilecfg into a struct poisoned with 0xFF: the 64 bytes the tile unit
// holds. Any byte the compiler dropped from the configuration shows up here (or ldtilecfg faults).
at::Tensor tile_config_roundtrip(int64_t rows, int64_t a_bytes, int64_t b_rows) {
#if !defined(__AMX_TILE__)
  TORCH_CHECK(false, "tile_config_roundtrip needs AMX: this is the kernel library's AVX2 build");
  return at::Tensor();
#else
  TORCH_CHECK(amx_permitted(), "the kernel needs AMX tiles and the OS refused them");
  TORCH_CHECK(rows >= 1 && rows <= kTileRows && b_rows >= 1 && b_rows <= kTileRows && a_bytes >= 4 &&
                  a_bytes <= 64 && a_bytes % 4 == 0, "rows, b_rows: 1..16; a_bytes: 4..64, a multiple of 4");
  configure(static_cast<int>(rows), static_cast<int>(a_bytes), static_cast<int>(b_rows));
  TileConfig held;
  std::fill_n(reinterpret_cast<uint8_t*>(&held), sizeof held, uint8_t{0xFF});
  store_tile_config(held);
  _tile_release();
  at::Tensor out = at::empty({static_cast<int64_t>(sizeof held)}, at::TensorOptions().dtype(at::kByte));
  std::copy_n(reinterpret_cast<const uint8_t*>(&held), sizeof held, out.data_ptr<uint8_t>());
  return out;
#endif
}

}  // namespace

#ifndef TE_NAMESPACE
#define TE_NAMESPACE tokenedge  // another name only for side-by-side builds in benchmarks
#endif

TORCH_LIBRARY(TE_NAMESPACE, m) {
  m.def("int4_mm(Tensor x, Tensor codes, Tensor factors) -> Tensor");
  m.def("int8_mm(Tensor x, Tensor codes, Tensor scales) -> Tensor");
  m.def("int8_vnni(Tensor u, Tensor row_scales, Tensor codes, Tensor colsum, Tensor scales) -> Tensor");
  // no tensor argument to dispatch on: a catch-all kernel
  m.def("tile_config_roundtrip(int rows, int a_bytes, int b_rows) -> Tensor", &tile_config_roundtrip);
}

TORCH_LIBRARY_IMPL(TE_NAMESPACE, CPU, m) {
  m.impl("int4_mm", &int4_mm);
  m.impl("int8_mm", &int8_mm);
  m.impl("int8_vnni", &int8_vnni);
}
