// y = x @ W.T for 4-bit weights in groups of 32 along K, on AMX bf16 tiles (Intel AMX-BF16).
//
// Batch invariance by construction: every output element is one fixed sequence of operations over its own
// row of x and its own column of W. For each group of 32 inputs a tile product gives the row's exact-code
// dot product (C[r, n] = sum_k x[r, k] * (128 + q[n, k]), the hardware's fixed order per element), then
// out = fma(scale, C, out) and out = fma(min, xsum, out), group after group. The number of rows in a call,
// a row's place among them, the column blocking and the thread split only decide which elements are
// computed side by side, never the arithmetic of one element.
//
// Codes enter the product exactly: code q is the bf16 number 128 + q (bits 0x4300 | q), x stays bf16,
// products are exact in fp32; the mins absorb the offset (`backend.kernels.pack_int4` packs them).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <torch/library.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;           // inputs per (column, group): one scale, one min
constexpr int64_t kLanes = 16;           // columns per block (one fp32 zmm, one tile's width)
constexpr int64_t kChunk = 32;           // packed bytes per chunk: 16 columns x 4 codes
constexpr int64_t kChunks = kGroup / 4;  // chunks per group
constexpr int64_t kGroupBytes = kChunk * kChunks;
constexpr int64_t kTileRows = 16;        // rows of x per tile product
constexpr int64_t kTileWords = kTileRows * kGroup;  // bf16 words in one unpacked B tile

struct Panel {
  const uint8_t* codes;  // [blocks, G, 256]
  const float* factors;  // [blocks, G, 2, 16]: the group's 16 scales, then its 16 mins
  int64_t groups;
  const float* scales(int64_t block, int64_t g) const { return factors + (block * groups + g) * 2 * kLanes; }
};

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// two sets of tiles, alternating by group so one group's product overlaps the last one's fold:
// C (rows x 16 fp32) in 0 and 1, A (rows x 32 bf16) in 2 and 3, B (16 k-pairs x 16 columns) in 4 and 5
void configure(int rows) {
  TileConfig cfg;
  for (int t : {0, 1, 2, 3}) {
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[t] = 64;
  }
  for (int t : {4, 5}) {
    cfg.rows[t] = kTileRows;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// groups [g, g + count) of a block's codes as bf16 (128 + q) in AMX's pair layout: row kp of a group's
// tile = (k = 2kp, 2kp + 1) for 16 columns
void unpack(const Panel& p, int64_t block, int64_t g, int64_t count, uint16_t* out) {
  const __m512i mask = _mm512_set1_epi16(0x000F);
  const __m512i bias = _mm512_set1_epi16(0x4300);
  const uint8_t* src = p.codes + (block * p.groups + g) * kGroupBytes;
  for (int64_t c = 0; c < count * kChunks; ++c) {
    __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c * kChunk)));
    _mm512_storeu_si512(out + c * 64, _mm512_ternarylogic_epi32(words, mask, bias, 0xEA));  // (a & b) | c
    _mm512_storeu_si512(out + c * 64 + 32,
                       _mm512_ternarylogic_epi32(_mm512_srli_epi16(words, 4), mask, bias, 0xEA));
  }
}

// acc[r] = fma(min, xsum[r], fma(scale, C[r], acc[r])) for the tile's rows
inline void fold(const float* c, const float* scale, const float* min, const float* xsum, int64_t groups,
                 int rows, float* acc) {
  const __m512 s = _mm512_loadu_ps(scale), z = _mm512_loadu_ps(min);
  for (int r = 0; r < rows; ++r) {
    __m512 a = _mm512_fmadd_ps(s, _mm512_load_ps(c + r * kLanes), _mm512_load_ps(acc + r * kLanes));
    _mm512_store_ps(acc + r * kLanes, _mm512_fmadd_ps(z, _mm512_set1_ps(xsum[r * groups]), a));
  }
}

inline void store_rows(const float* acc, int rows, uint16_t* y, int64_t ldy) {
  for (int r = 0; r < rows; ++r)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * ldy),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(acc + r * kLanes)));
}

struct Scratch {
  std::vector<uint16_t> b;
  alignas(64) float c0[kTileRows * kLanes], c1[kTileRows * kLanes];
  alignas(64) float acc[kTileRows * kLanes];
};

constexpr int64_t kRing = 4;  // streamed groups: unpacked two ahead of their product into a ring of tiles

#define TE_PRODUCT(C, A, B, g)                                                           \
  if (stream && (g) + 1 < p.groups) unpack(p, b, (g) + 1, 1, s.b.data() + (((g) + 1) % kRing) * kTileWords); \
  _tile_zero(C);                                                                        \
  _tile_loadd(A, x + (g) * kGroup, ldx * 2);                                            \
  _tile_loadd(B, s.b.data() + (stream ? (g) % kRing : (g)) * kTileWords, 64);           \
  _tile_dpbf16ps(C, A, B)

// rows [0, rows) of x against block b: streamed (each group unpacked just ahead of its product) or from the
// block unpacked whole into s.b (when several row tiles share it)
template <bool stream>
void tile_rows(const Panel& p, int64_t b, const uint16_t* x, int64_t ldx, const float* xsum, int rows, Scratch& s,
               uint16_t* y, int64_t ldy) {
  if (stream) unpack(p, b, 0, 1, s.b.data());
  std::fill(s.acc, s.acc + rows * kLanes, 0.0f);
  TE_PRODUCT(0, 2, 4, 0);
  for (int64_t g = 0; g < p.groups; g += 2) {
    if (g + 1 < p.groups) {
      TE_PRODUCT(1, 3, 5, g + 1);
    }
    _tile_stored(0, s.c0, 64);
    fold(s.c0, p.scales(b, g), p.scales(b, g) + kLanes, xsum + g, p.groups, rows, s.acc);
    if (g + 1 >= p.groups) break;
    if (g + 2 < p.groups) {
      TE_PRODUCT(0, 2, 4, g + 2);
    }
    _tile_stored(1, s.c1, 64);
    fold(s.c1, p.scales(b, g + 1), p.scales(b, g + 1) + kLanes, xsum + g + 1, p.groups, rows, s.acc);
  }
  store_rows(s.acc, rows, y + b * kLanes, ldy);
}

void span(const Panel& p, int64_t begin, int64_t end, const uint16_t* x, int64_t m, int64_t k,
          const float* xsum, uint16_t* y, int64_t ldy) {
  thread_local Scratch s;
  s.b.resize(std::max(p.groups, kRing) * kTileWords);
  int configured = 0;
  for (int64_t b = begin; b < end; ++b) {
    if (m <= kTileRows) {
      if (m != configured) configure(configured = static_cast<int>(m));
      tile_rows<true>(p, b, x, k, xsum, static_cast<int>(m), s, y, ldy);
      continue;
    }
    unpack(p, b, 0, p.groups, s.b.data());
    for (int64_t r = 0; r < m; r += kTileRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kTileRows, m - r));
      if (rows != configured) configure(configured = rows);
      tile_rows<false>(p, b, x + r * k, k, xsum + r * p.groups, rows, s, y + r * ldy, ldy);
    }
  }
  _tile_release();
}

// xsum[r, g] = sum of the 32 bf16 of row r, group g, in fp32 (one fixed order)
void group_sums(const uint16_t* x, int64_t m, int64_t groups, float* xsum) {
  for (int64_t i = 0; i < m * groups; ++i) {
    __m512i raw = _mm512_loadu_si512(x + i * kGroup);
    __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(raw)), 16));
    __m512 b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(raw, 1)), 16));
    xsum[i] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
  }
}

bool amx_permitted() {
  static const bool ok = [] {
    constexpr int kReqPerm = 0x1023, kXtiledata = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kReqPerm, kXtiledata) == 0;
  }();
  return ok;
}

at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& factors) {
  TORCH_CHECK(amx_permitted(), "the kernel needs AMX tiles and the OS refused them");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x: [M, K] bf16, contiguous");
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == at::kByte && codes.is_contiguous() &&
                  codes.size(2) == kGroupBytes, "codes: [N / 16, K / 32, 256] uint8");
  TORCH_CHECK(factors.scalar_type() == at::kFloat && factors.is_contiguous(), "factors: [N / 16, K / 32, 2, 16] fp32");
  const int64_t m = x.size(0), k = x.size(1), blocks = codes.size(0), groups = codes.size(1);
  TORCH_CHECK(k == groups * kGroup, "x has ", k, " columns, the weight ", groups * kGroup);
  TORCH_CHECK(factors.numel() == blocks * groups * 2 * kLanes, "factors: [N / 16, K / 32, 2, 16] fp32");
  at::Tensor y = at::empty({m, blocks * kLanes}, x.options());
  if (m == 0) return y;
  at::Tensor xsum = at::empty({m, groups}, x.options().dtype(at::kFloat));
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  group_sums(xp, m, groups, xsum.data_ptr<float>());
  const Panel p{codes.data_ptr<uint8_t>(), factors.data_ptr<float>(), groups};
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  const float* xs = xsum.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    span(p, begin, end, xp, m, k, xs, yp, blocks * kLanes);
  });
  return y;
}

// ---- int8 rows for the LM head's approximate logits: y[m, n] = scale[n] * sum_k x[m, k] * code[n, k] ----
// Codes (-127..127) are exact in bf16; sums accumulate in fp32 across all of K in two tiles (even and odd
// groups) added at the end. Only an approximation (backend.model.quant.RescoredHead rescores every candidate
// exactly), so its summation order is free; its error is fp32 accumulation, inside the head's bound.

constexpr int64_t kInt8GroupBytes = kTileRows * kLanes * 2;  // one B tile of int8 codes: 16 k-pairs x 16 x 2

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
        _tile_loadd(2, xr + g * kGroup, k * 2);
        _tile_loadd(4, b.data() + g * kTileWords, 64);
        _tile_dpbf16ps(0, 2, 4);
        _tile_loadd(3, xr + (g + 1) * kGroup, k * 2);
        _tile_loadd(5, b.data() + (g + 1) * kTileWords, 64);
        _tile_dpbf16ps(1, 3, 5);
      }
      if (g < groups) {
        _tile_loadd(2, xr + g * kGroup, k * 2);
        _tile_loadd(4, b.data() + g * kTileWords, 64);
        _tile_dpbf16ps(0, 2, 4);
      }
      _tile_stored(0, c0, 64);
      _tile_stored(1, c1, 64);
      for (int i = 0; i < rows; ++i)
        _mm512_storeu_ps(y + (r + i) * ldy + blk * kLanes,
                         _mm512_mul_ps(scale, _mm512_add_ps(_mm512_load_ps(c0 + i * kLanes),
                                                            _mm512_load_ps(c1 + i * kLanes))));
    }
  }
  _tile_release();
}

at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
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
}

// ---- int8 rows against a few activation rows on AVX512-VNNI, for the LM head's approximate logits at 1..3
// rows: y[m, n] = scales[n] * sum_p row_scales[m, p] * (sum_k u[m, p, k] * code[n, k] - 128 * colsum[n]),
// where u[m, p] = q[m, p] + 128 are the two int8 passes of the row (the value, then its residual) offset to
// unsigned. Integer sums are exact, so the blocking is free. ----

constexpr int64_t kQuad = 4;  // k per VNNI lane step: codes [N/16, K/4, 16 x 4]

void vnni_span(const int8_t* codes, const int32_t* colsum, const float* scales, int64_t quads, int64_t begin,
               int64_t end, const uint8_t* u, const float* row_scales, int64_t m, float* y, int64_t ldy) {
  for (int64_t blk = begin; blk < end; ++blk) {
    const int8_t* w = codes + blk * quads * kLanes * kQuad;
    const __m512 cs = _mm512_cvtepi32_ps(_mm512_loadu_si512(colsum + blk * kLanes));
    const __m512 sc = _mm512_loadu_ps(scales + blk * kLanes);
    for (int64_t r = 0; r < m; ++r) {
      const int32_t* u0 = reinterpret_cast<const int32_t*>(u + r * 2 * quads * kQuad);
      const int32_t* u1 = u0 + quads;
      __m512i a0 = _mm512_setzero_si512(), a1 = a0, b0 = a0, b1 = a0;  // two chains per pass
      int64_t q = 0;
      for (; q + 1 < quads; q += 2) {
        const __m512i w0 = _mm512_loadu_si512(w + q * 64), w1 = _mm512_loadu_si512(w + (q + 1) * 64);
        a0 = _mm512_dpbusd_epi32(a0, _mm512_set1_epi32(u0[q]), w0);
        b0 = _mm512_dpbusd_epi32(b0, _mm512_set1_epi32(u1[q]), w0);
        a1 = _mm512_dpbusd_epi32(a1, _mm512_set1_epi32(u0[q + 1]), w1);
        b1 = _mm512_dpbusd_epi32(b1, _mm512_set1_epi32(u1[q + 1]), w1);
      }
      if (q < quads) {
        const __m512i w0 = _mm512_loadu_si512(w + q * 64);
        a0 = _mm512_dpbusd_epi32(a0, _mm512_set1_epi32(u0[q]), w0);
        b0 = _mm512_dpbusd_epi32(b0, _mm512_set1_epi32(u1[q]), w0);
      }
      const __m512 off = _mm512_mul_ps(_mm512_set1_ps(128.0f), cs);
      const __m512 d0 = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), off);
      const __m512 d1 = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(b0, b1)), off);
      const __m512 v = _mm512_fmadd_ps(_mm512_set1_ps(row_scales[r * 2]), d0,
                                       _mm512_mul_ps(_mm512_set1_ps(row_scales[r * 2 + 1]), d1));
      _mm512_storeu_ps(y + r * ldy + blk * kLanes, _mm512_mul_ps(sc, v));
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
  at::parallel_for(0, blocks, 64, [&](int64_t begin, int64_t end) {
    vnni_span(cp, csp, sp, quads, begin, end, up, rs, m, yp, blocks * kLanes);
  });
  return y;
}

}  // namespace

#ifndef TE_NAMESPACE
#define TE_NAMESPACE tokenedge  // another name only for side-by-side builds in benchmarks
#endif

TORCH_LIBRARY(TE_NAMESPACE, m) {
  m.def("int4_mm(Tensor x, Tensor codes, Tensor factors) -> Tensor");
  m.def("int8_mm(Tensor x, Tensor codes, Tensor scales) -> Tensor");
  m.def("int8_vnni(Tensor u, Tensor row_scales, Tensor codes, Tensor colsum, Tensor scales) -> Tensor");
}

TORCH_LIBRARY_IMPL(TE_NAMESPACE, CPU, m) {
  m.impl("int4_mm", &int4_mm);
  m.impl("int8_mm", &int8_mm);
  m.impl("int8_vnni", &int8_vnni);
}
