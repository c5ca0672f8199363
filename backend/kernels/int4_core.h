// The int4 kernel's core shared by its translation units (int4_amx.cpp: the int4_mm op and its AMX path;
// decoder_step.cpp: the whole decoder step): the packed panel, the two-pass int8 quantization of a row and
// the AVX512-VNNI product of a few rows. Every output element is one fixed sequence of operations over its own
// row and column (int4_amx.cpp's header says why that makes it batch-invariant).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace te {

constexpr int64_t kGroup = 32;          // inputs per (column, group): one scale, one zero
constexpr int64_t kLanes = 16;          // columns per block: one zmm of int32 / fp32, one tile's width
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

struct Panel {
  const uint8_t* codes;  // [blocks, G, 8 quads, 32]
  const uint16_t* factors;  // [blocks, G, 2, 16] fp16: the group's 16 scales, then its 16 zp (GGUF's own fp16)
  int64_t groups;
  const uint16_t* scales(int64_t block, int64_t g) const { return factors + (block * groups + g) * 2 * kLanes; }
};

// x quantized: a[row][pass][k] int8, s[row][g][pass] and xs[row][g] fp32
struct Quantized {
  const int8_t* a;
  const float* s;
  const float* xs;
  int64_t k, groups;
};

// one quad's codes as bytes: lane c = q[c, 4j .. 4j + 3] (nibbles (k0 | k1 << 4), (k2 | k3 << 4) per column)
inline __m512i quad_codes(const uint8_t* src) {
  const __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  return _mm512_ternarylogic_epi32(words, _mm512_slli_epi16(words, 4), _mm512_set1_epi16(0x0F0F), 0xA8);
}

// out[r] = fma(zp, xs, fma(scale, s1 * S1 + s2 * S2, out[r])): the one fold of a group, for every path
inline __m512 half16(const uint16_t* f) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(f)));
}

inline __m512 fold(__m512 out, __m512i s1_sum, __m512i s2_sum, const float* s, float xs, const uint16_t* f) {
  __m512 dot = _mm512_mul_ps(_mm512_set1_ps(s[0]), _mm512_cvtepi32_ps(s1_sum));
  dot = _mm512_fmadd_ps(_mm512_set1_ps(s[1]), _mm512_cvtepi32_ps(s2_sum), dot);
  out = _mm512_fmadd_ps(half16(f), dot, out);
  return _mm512_fmadd_ps(half16(f + kLanes), _mm512_set1_ps(xs), out);
}

inline void store_row(__m512 out, uint16_t* y) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), (__m256i)_mm512_cvtneps_pbh(out));
}

// a few rows: per group, the 8 quads unpacked once, then for each row vpdpbusd in two chains per pass
// (integer sums: exact in any order) and the fold
inline void vnni_block(const Panel& p, int64_t b, const Quantized& x, int64_t m, uint16_t* y, int64_t ldy) {
  __m512 out[kAmxRows];
  for (int64_t r = 0; r < m; ++r) out[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < p.groups; ++g) {
    const uint8_t* src = p.codes + (b * p.groups + g) * kGroupBytes;
    // the same group kPrefetchBlocks blocks on, into L2: a one-row product waits on memory, not on arithmetic
    // (a prefetch never faults, past the panel's end included)
    const uint8_t* ahead = src + kPrefetchBlocks * p.groups * kGroupBytes;
    for (int64_t line = 0; line < kGroupBytes; line += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + line), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(p.scales(b + kPrefetchBlocks, g)), _MM_HINT_T1);
    __m512i q[kQuads];
    for (int64_t j = 0; j < kQuads; ++j) q[j] = quad_codes(src + j * kQuadBytes);
    for (int64_t r = 0; r < m; ++r) {
      const int32_t* a1 = reinterpret_cast<const int32_t*>(x.a + (r * 2) * x.k + g * kGroup);
      const int32_t* a2 = reinterpret_cast<const int32_t*>(x.a + (r * 2 + 1) * x.k + g * kGroup);
      __m512i c1a = _mm512_setzero_si512(), c1b = c1a, c2a = c1a, c2b = c1a;
      for (int64_t j = 0; j < kQuads; j += 2) {
        c1a = _mm512_dpbusd_epi32(c1a, q[j], _mm512_set1_epi32(a1[j]));
        c2a = _mm512_dpbusd_epi32(c2a, q[j], _mm512_set1_epi32(a2[j]));
        c1b = _mm512_dpbusd_epi32(c1b, q[j + 1], _mm512_set1_epi32(a1[j + 1]));
        c2b = _mm512_dpbusd_epi32(c2b, q[j + 1], _mm512_set1_epi32(a2[j + 1]));
      }
      out[r] = fold(out[r], _mm512_add_epi32(c1a, c1b), _mm512_add_epi32(c2a, c2b), x.s + (r * p.groups + g) * 2,
                    x.xs[r * p.groups + g], p.scales(b, g));
    }
  }
  for (int64_t r = 0; r < m; ++r) store_row(out[r], y + r * ldy + b * kLanes);
}

// one row's groups: s1 = max|x| / 127, a1 = round(x / s1), s2 = s1 / 254, a2 = round((x - s1 a1) / s2),
// xs = s1 * sum(a1) + s2 * sum(a2); all in one fixed order per group
inline void quantize_row(const uint16_t* x, int64_t groups, int8_t* a1, int8_t* a2, float* s, float* xs) {
  for (int64_t g = 0; g < groups; ++g) {
    __m512 v[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + g * kGroup + h * 16));
      v[h] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    const float s1 = amax / 127.0f, s2 = s1 / 254.0f;
    const __m512 inv1 = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    const __m512 inv2 = _mm512_set1_ps(amax > 0 ? 254.0f * 127.0f / amax : 0.0f);
    int32_t sum1 = 0, sum2 = 0;
    for (int h = 0; h < 2; ++h) {
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v[h], inv1));  // round to nearest even
      const __m512 rest = _mm512_fnmadd_ps(_mm512_set1_ps(s1), _mm512_cvtepi32_ps(q1), v[h]);
      const __m512i q2 = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(rest, inv2)),
                                                           _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a1 + g * kGroup + h * 16), _mm512_cvtepi32_epi8(q1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a2 + g * kGroup + h * 16), _mm512_cvtepi32_epi8(q2));
      sum1 += _mm512_reduce_add_epi32(q1);
      sum2 += _mm512_reduce_add_epi32(q2);
    }
    s[g * 2] = s1;
    s[g * 2 + 1] = s2;
    xs[g] = std::fma(s2, static_cast<float>(sum2), s1 * static_cast<float>(sum1));
  }
}

// rows 0..m-1 against blocks [begin, end): per block, vnni_block over runs of up to kAmxRows rows (a row's sums
// are the same in any run)
inline void vnni_blocks(const Panel& p, const Quantized& x, int64_t m, int64_t begin, int64_t end, uint16_t* y,
                        int64_t ldy) {
  for (int64_t b = begin; b < end; ++b)
    for (int64_t r0 = 0; r0 < m; r0 += kAmxRows) {
      const Quantized part{x.a + r0 * 2 * x.k, x.s + r0 * x.groups * 2, x.xs + r0 * x.groups, x.k, x.groups};
      vnni_block(p, b, part, std::min<int64_t>(kAmxRows, m - r0), y + r0 * ldy, ldy);
    }
}

}  // namespace te
