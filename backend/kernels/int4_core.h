// The int4 kernel's core shared by its translation units (int4_amx.cpp: the int4_mm op and its AMX path;
// decoder_step.cpp: the whole decoder step): the packed panel, the two-pass int8 quantization of a row and
// the integer product of a few rows (AVX512-VNNI, or AVX2 in the AVX2 build: simd.h). Every output element is
// one fixed sequence of operations over its own row and column (int4_amx.cpp's header says why that makes it
// batch-invariant).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "simd.h"

#if defined(__AVX512F__) && !defined(__AVX512VNNI__)
#error "the AVX512 build needs AVX512-VNNI (build.py passes its flags together)"
#endif

namespace te {

constexpr int64_t kGroup = 32;          // inputs per (column, group): one scale, one zero
constexpr int64_t kLanes = 16;          // columns per block: one F32x16 / I32x16, one tile's width
constexpr int64_t kQuads = kGroup / 4;  // 4-input steps per group (one vpdpbusd, one B tile row)
constexpr int64_t kQuadBytes = 32;      // packed nibbles of one quad: 16 columns x 4 codes
constexpr int64_t kGroupBytes = kQuads * kQuadBytes;
constexpr int64_t kTileRows = 16;        // rows of x per tile product
constexpr int64_t kAmxRows = 8;          // rows per AMX product (both passes fill a 16-row tile)
// calls of at least this many rows take the AMX path (measured, 2 threads: VNNI grows about 0.7 ms a row over
// SmolLM2's 120 projections, AMX costs 4.6 ms at 4 rows, 6.5 at 8); a decode step of 1-3 rows (batch 1, or a
// verify of 2 drafts) never touches the AMX unit, whose power licence slows the rest of the step
constexpr int64_t kAmxFrom = 4;
static_assert(kAmxFrom <= kAmxRows, "the VNNI path keeps at most kAmxRows rows in registers");

constexpr int64_t kPrefetchBlocks = 2;  // how far ahead vnni_block asks for codes (1: -7%, 2 and 4: -14%)

// factors per (block, group): 2 planes, the 16 scales then the 16 zero points zp (Q4_1: GGUF's own fp16 d and
// m); or 1 plane, the scales alone, where every zp is -8 * scale (Q4_0), which the fold then computes: the same
// fp32 value the second plane would hold (times 8 is exact), so the same bits, from 10% fewer bytes a decode
// step streams (288 instead of 320 a group)
struct Panel {
  const uint8_t* codes;  // [blocks, G, 8 quads, 32]
  const uint16_t* factors;  // [blocks, G, planes, 16] fp16
  int64_t groups;
  int64_t planes;  // 1 or 2
  const uint16_t* scales(int64_t block, int64_t g) const { return factors + (block * groups + g) * planes * kLanes; }
};

// x quantized: a[row][pass][k] int8, s[row][g][pass] and xs[row][g] fp32
struct Quantized {
  const int8_t* a;
  const float* s;
  const float* xs;
  int64_t k, groups;
};

// one quad's codes as bytes: lane c = q[c, 4j .. 4j + 3] (nibbles (k0 | k1 << 4), (k2 | k3 << 4) per column)
inline I32x16 quad_codes(const uint8_t* src) {
#if defined(__AVX512F__)
  const __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  return _mm512_ternarylogic_epi32(words, _mm512_slli_epi16(words, 4), _mm512_set1_epi16(0x0F0F), 0xA8);
#else
  // the 64-bit quarters reordered (0, 2, 1, 3) so that each 128-bit lane's unpack takes 4 whole columns in
  // order: unpacklo interleaves the low and high nibbles of bytes 0-15 (columns 0-7), unpackhi of bytes 16-31
  // (measured: 8% faster at one row than widening each half to words)
  const __m256i bytes = _mm256_permute4x64_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)), 0xD8);
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i low = _mm256_and_si256(bytes, mask), high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
  return {_mm256_unpacklo_epi8(low, high), _mm256_unpackhi_epi8(low, high)};
#endif
}

// S = sum over the group's 8 quads of codes x activations (one pass: 4 int8 per quad, broadcast to the lanes):
// per column the exact integer sum of its 32 products, so the same integers on every path and in any order.
// AVX512-VNNI: vpdpbusd in two chains. AVX2: vpmaddubsw of the codes (unsigned, 0..15) and the activations
// (signed, -127..127: quantize_row clamps a2, and a1 = round(x / s1) with s1 = max|x| / 127) leaves in each
// int16 the sum of 2 products, |.| <= 2 * 15 * 127 = 3810; the 8 quads add in int16, |.| <= 16 * 15 * 127 =
// 30480 < 32767, no saturation anywhere, and vpmaddwd with ones adds each column's two int16 into its int32.
inline I32x16 group_sums(const I32x16* q, const int32_t* a) {
#if defined(__AVX512F__)
  __m512i c0 = _mm512_setzero_si512(), c1 = c0;
  for (int64_t j = 0; j < kQuads; j += 2) {
    c0 = _mm512_dpbusd_epi32(c0, q[j], _mm512_set1_epi32(a[j]));
    c1 = _mm512_dpbusd_epi32(c1, q[j + 1], _mm512_set1_epi32(a[j + 1]));
  }
  return _mm512_add_epi32(c0, c1);
#else
  __m256i lo = _mm256_setzero_si256(), hi = lo;
  for (int64_t j = 0; j < kQuads; ++j) {
    const __m256i act = _mm256_set1_epi32(a[j]);
    lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(q[j].lo, act));
    hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(q[j].hi, act));
  }
  const __m256i ones = _mm256_set1_epi16(1);
  return {_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones)};
#endif
}

// out[r] = fma(zp, xs, fma(scale, s1 * S1 + s2 * S2, out[r])): the one fold of a group, for every path (zp
// read from the second plane, or -8 * scale with one: Panel)
template <int kPlanes>
inline F32x16 fold(F32x16 out, I32x16 s1_sum, I32x16 s2_sum, const float* s, float xs, const uint16_t* f) {
  static_assert(kPlanes == 1 || kPlanes == 2, "one plane (scales) or two (scales, zero points)");
  F32x16 dot = mul(splat(s[0]), to_float(s1_sum));
  dot = fmadd(splat(s[1]), to_float(s2_sum), dot);
  const F32x16 scale = load_fp16(f);
  out = fmadd(scale, dot, out);
  return fmadd(kPlanes == 2 ? load_fp16(f + kLanes) : mul(scale, splat(-8.0f)), splat(xs), out);
}

inline void store_row(F32x16 out, uint16_t* y) { store_bf16(y, out); }

// a few rows: per group, the 8 quads unpacked once, then for each row the two passes' sums (group_sums) and the
// fold
template <int kPlanes>
inline void vnni_block(const Panel& p, int64_t b, const Quantized& x, int64_t m, uint16_t* y, int64_t ldy) {
  F32x16 out[kAmxRows];
  for (int64_t r = 0; r < m; ++r) out[r] = zero();
  for (int64_t g = 0; g < p.groups; ++g) {
    const uint8_t* src = p.codes + (b * p.groups + g) * kGroupBytes;
    // the same group kPrefetchBlocks blocks on, into L2: a one-row product waits on memory, not on arithmetic
    // (a prefetch never faults, past the panel's end included)
    const uint8_t* ahead = src + kPrefetchBlocks * p.groups * kGroupBytes;
    for (int64_t line = 0; line < kGroupBytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + line), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(p.scales(b + kPrefetchBlocks, g)), _MM_HINT_T1);
    I32x16 q[kQuads];
    for (int64_t j = 0; j < kQuads; ++j) q[j] = quad_codes(src + j * kQuadBytes);
    for (int64_t r = 0; r < m; ++r) {
      const int32_t* a1 = reinterpret_cast<const int32_t*>(x.a + (r * 2) * x.k + g * kGroup);
      const int32_t* a2 = reinterpret_cast<const int32_t*>(x.a + (r * 2 + 1) * x.k + g * kGroup);
      out[r] = fold<kPlanes>(out[r], group_sums(q, a1), group_sums(q, a2), x.s + (r * p.groups + g) * 2,
                             x.xs[r * p.groups + g], p.scales(b, g));
    }
  }
  for (int64_t r = 0; r < m; ++r) store_row(out[r], y + r * ldy + b * kLanes);
}

// one row's groups: s1 = max|x| / 127, a1 = round(x / s1), s2 = s1 / 254, a2 = round((x - s1 a1) / s2),
// xs = s1 * sum(a1) + s2 * sum(a2); all in one fixed order per group
inline void quantize_row(const uint16_t* x, int64_t groups, int8_t* a1, int8_t* a2, float* s, float* xs) {
  for (int64_t g = 0; g < groups; ++g) {
    F32x16 v[2];
    for (int h = 0; h < 2; ++h) v[h] = load_bf16(x + g * kGroup + h * 16);
    const float amax = reduce_max(max(abs(v[0]), abs(v[1])));
    const float s1 = amax / 127.0f, s2 = s1 / 254.0f;
    const F32x16 inv1 = splat(amax > 0 ? 127.0f / amax : 0.0f);
    const F32x16 inv2 = splat(amax > 0 ? 254.0f * 127.0f / amax : 0.0f);
    int32_t sum1 = 0, sum2 = 0;
    for (int h = 0; h < 2; ++h) {
      const I32x16 q1 = to_int(mul(v[h], inv1));  // round to nearest even
      const F32x16 rest = fnmadd(splat(s1), to_float(q1), v[h]);
      const I32x16 q2 = max(min(to_int(mul(rest, inv2)), splat_i(127)), splat_i(-127));
      store_i8(a1 + g * kGroup + h * 16, q1);
      store_i8(a2 + g * kGroup + h * 16, q2);
      sum1 += reduce_add(q1);
      sum2 += reduce_add(q2);
    }
    s[g * 2] = s1;
    s[g * 2 + 1] = s2;
    xs[g] = std::fma(s2, static_cast<float>(sum2), s1 * static_cast<float>(sum1));
  }
}

// rows 0..m-1 against blocks [begin, end): per block, vnni_block over runs of up to kAmxRows rows (a row's sums
// are the same in any run)
template <int kPlanes>
inline void vnni_blocks_of(const Panel& p, const Quantized& x, int64_t m, int64_t begin, int64_t end, uint16_t* y,
                           int64_t ldy) {
  for (int64_t b = begin; b < end; ++b)
    for (int64_t r0 = 0; r0 < m; r0 += kAmxRows) {
      const Quantized part{x.a + r0 * 2 * x.k, x.s + r0 * x.groups * 2, x.xs + r0 * x.groups, x.k, x.groups};
      vnni_block<kPlanes>(p, b, part, std::min<int64_t>(kAmxRows, m - r0), y + r0 * ldy, ldy);
    }
}

inline void vnni_blocks(const Panel& p, const Quantized& x, int64_t m, int64_t begin, int64_t end, uint16_t* y,
                        int64_t ldy) {
  if (p.planes == 1) return vnni_blocks_of<1>(p, x, m, begin, end, y, ldy);
  vnni_blocks_of<2>(p, x, m, begin, end, y, ldy);
}

}  // namespace te
