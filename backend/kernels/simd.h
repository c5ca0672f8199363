// The kernels' vector types and the few operations they use, for the two ISAs the library builds for
// (backend/kernels/build.py picks one from the CPU): 16 fp32 lanes (`F32x16`), 16 int32 lanes (`I32x16`), a
// 16-lane mask (`Mask16`) and 8 fp64 lanes (`F64x8`, rescore.cpp's exact dot products).
//   AVX512 build (__AVX512F__: AVX512-BF16/VNNI, AMX where the CPU has it): each type is one zmm register and each
//     operation the AVX512 intrinsic the kernels called before this header existed, so that build's bits are
//     unchanged by it.
//   AVX2 build (AVX2, FMA, F16C, BMI2: an AMD EPYC before Zen 4, Intel before Skylake-SP): each type is two
//     ymm halves (lanes 0-7, 8-15) and each operation the same one on both halves, except where AVX2 has no
//     counterpart: fp32 -> bf16 rounding (integer ops, below), 2^n scaling (an exponent built by shift), the
//     horizontal reductions (a fixed tree over the lanes), and the integer dot products (int4_core.h's
//     `group_sums`, int4_amx.cpp's `head_dot`: vpmaddubsw for vpdpbusd, exact all the same).
// Within a build every operation is one fixed sequence per lane (the reductions one fixed tree), so the kernels'
// batch invariance holds on either; across the two builds the last bits of the fp32 arithmetic may differ,
// which is why the served kernel id names the build (backend/kernels/load.py: kernel_id).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace te {

#if defined(__AVX512F__)

using F32x16 = __m512;
using I32x16 = __m512i;
using Mask16 = __mmask16;
using F64x8 = __m512d;

inline F32x16 zero() { return _mm512_setzero_ps(); }
inline F32x16 splat(float v) { return _mm512_set1_ps(v); }
inline F32x16 loadu(const float* p) { return _mm512_loadu_ps(p); }
inline void storeu(float* p, F32x16 v) { _mm512_storeu_ps(p, v); }
inline F32x16 add(F32x16 a, F32x16 b) { return _mm512_add_ps(a, b); }
inline F32x16 sub(F32x16 a, F32x16 b) { return _mm512_sub_ps(a, b); }
inline F32x16 mul(F32x16 a, F32x16 b) { return _mm512_mul_ps(a, b); }
inline F32x16 div(F32x16 a, F32x16 b) { return _mm512_div_ps(a, b); }
inline F32x16 max(F32x16 a, F32x16 b) { return _mm512_max_ps(a, b); }
inline F32x16 abs(F32x16 a) { return _mm512_abs_ps(a); }
inline F32x16 fmadd(F32x16 a, F32x16 b, F32x16 c) { return _mm512_fmadd_ps(a, b, c); }    // a * b + c
inline F32x16 fnmadd(F32x16 a, F32x16 b, F32x16 c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
inline float reduce_add(F32x16 v) { return _mm512_reduce_add_ps(v); }
inline float reduce_max(F32x16 v) { return _mm512_reduce_max_ps(v); }
// out[k] = reduce_add(v[k]) * scale for 8 vectors: the same bits as 8 reduce_adds
inline void reduce_add8(const F32x16* v, float scale, float* out) {
  for (int k = 0; k < 8; ++k) out[k] = reduce_add(v[k]) * scale;
}
inline F32x16 round_even(F32x16 v) { return _mm512_roundscale_ps(v, 0); }  // to the nearest integer, even on ties
inline F32x16 scalef(F32x16 x, F32x16 n) { return _mm512_scalef_ps(x, n); }  // x * 2^n, n integral

// bf16 <-> fp32: a bf16 is the top half of an fp32's bits; fp32 -> bf16 rounds to nearest even (vcvtneps2bf16)
inline F32x16 load_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline void store_bf16(uint16_t* p, F32x16 v) { _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v)); }
inline F32x16 round_bf16(F32x16 v) {  // to the nearest bf16 (even on ties), back in fp32
  const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline F32x16 load_fp16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }

// masks: lanes [0, n) of a tail, and a < b per lane
inline Mask16 first_lanes(int64_t n) { return n >= 16 ? Mask16(0xFFFF) : static_cast<Mask16>((1u << n) - 1); }
inline Mask16 less(F32x16 a, F32x16 b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
inline F32x16 load_masked(Mask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }  // 0 elsewhere
inline void store_masked(float* p, Mask16 m, F32x16 v) { _mm512_mask_storeu_ps(p, m, v); }
inline F32x16 keep(Mask16 m, F32x16 v) { return _mm512_maskz_mov_ps(m, v); }  // 0 outside m
inline F32x16 select(Mask16 m, F32x16 yes, F32x16 no) { return _mm512_mask_blend_ps(m, no, yes); }

// int32 lanes
inline I32x16 zero_i() { return _mm512_setzero_si512(); }
inline I32x16 splat_i(int32_t v) { return _mm512_set1_epi32(v); }
inline I32x16 add(I32x16 a, I32x16 b) { return _mm512_add_epi32(a, b); }
inline I32x16 min(I32x16 a, I32x16 b) { return _mm512_min_epi32(a, b); }
inline I32x16 max(I32x16 a, I32x16 b) { return _mm512_max_epi32(a, b); }
inline int32_t reduce_add(I32x16 v) { return _mm512_reduce_add_epi32(v); }
inline F32x16 to_float(I32x16 v) { return _mm512_cvtepi32_ps(v); }
inline I32x16 to_int(F32x16 v) { return _mm512_cvtps_epi32(v); }  // round to nearest even
inline I32x16 load_i(const void* p) { return _mm512_loadu_si512(p); }
inline void store_i8(int8_t* p, I32x16 v) { _mm_storeu_si128((__m128i*)p, _mm512_cvtepi32_epi8(v)); }  // |v| <= 127

// fp64: 8 lanes
inline F64x8 zero_d() { return _mm512_setzero_pd(); }
inline F64x8 widen(const float* p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }  // 8 floats, exactly
inline F64x8 fmadd(F64x8 a, F64x8 b, F64x8 c) { return _mm512_fmadd_pd(a, b, c); }
inline void storeu(double* p, F64x8 v) { _mm512_storeu_pd(p, v); }

#else  // AVX2 + FMA + F16C: two ymm halves

struct F32x16 {
  __m256 lo, hi;
};
struct I32x16 {
  __m256i lo, hi;
};
struct Mask16 {  // all ones or all zeros per lane, as the AVX2 compares and blends take them
  __m256 lo, hi;
};
struct F64x8 {
  __m256d lo, hi;
};

inline F32x16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F32x16 splat(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
inline F32x16 loadu(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void storeu(float* p, F32x16 v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
inline F32x16 add(F32x16 a, F32x16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline F32x16 sub(F32x16 a, F32x16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline F32x16 mul(F32x16 a, F32x16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline F32x16 div(F32x16 a, F32x16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline F32x16 max(F32x16 a, F32x16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline F32x16 abs(F32x16 a) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(a.lo, magnitude), _mm256_and_ps(a.hi, magnitude)};
}
inline F32x16 fmadd(F32x16 a, F32x16 b, F32x16 c) {  // a * b + c, one rounding
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline F32x16 fnmadd(F32x16 a, F32x16 b, F32x16 c) {  // c - a * b, one rounding
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}

// the 8 lanes of a half to one value, in one fixed tree: (0+4, 1+5, 2+6, 3+7), then (+2), then (+1)
inline float reduce8_add(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float reduce8_max(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
inline float reduce_add(F32x16 v) { return reduce8_add(_mm256_add_ps(v.lo, v.hi)); }  // lane i + lane i + 8 first
inline float reduce_max(F32x16 v) { return reduce8_max(_mm256_max_ps(v.lo, v.hi)); }
// out[k] = reduce_add(v[k]) * scale for 8 vectors, transposed: every level of reduce_add's tree (lo + hi, lane
// i + i+4, i + i+2, i + i+1) is one vertical add across 8 keys at once, so each key gets reduce_add's bits without
// 8 horizontal chains. Lanes stay in key order: pairs (k, k+4) share a vector's 128-bit halves.
inline __m256 pair_sums(__m256 a, __m256 b) {  // per 128-bit half: (a0 + a2, a1 + a3, b0 + b2, b1 + b3)
  return _mm256_add_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
inline void reduce_add8(const F32x16* v, float scale, float* out) {
  __m256 s[4];  // s[k]: [key k's (i + i+4) | key k+4's], after lo + hi
  for (int k = 0; k < 4; ++k) {
    const __m256 a = _mm256_add_ps(v[k].lo, v[k].hi), b = _mm256_add_ps(v[k + 4].lo, v[k + 4].hi);
    s[k] = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  }
  const __m256 t01 = pair_sums(s[0], s[1]), t23 = pair_sums(s[2], s[3]);  // (i + i+2) of keys 0,1 | 4,5 and 2,3 | 6,7
  const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 1, 3, 1)));  // keys 0-3 | 4-7
  _mm256_storeu_ps(out, _mm256_mul_ps(r, _mm256_set1_ps(scale)));
}
inline F32x16 round_even(F32x16 v) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(v.lo, kNearest), _mm256_round_ps(v.hi, kNearest)};
}
// x * 2^n for integral n in [-126, 127] (exp_neg clamps its input to -87, so n >= -126): 2^n built as the fp32
// whose exponent field is n + 127, then one multiplication, exact but for the rounding of a subnormal result
// (as vscalefps)
inline __m256 scalef8(__m256 x, __m256 n) {
  const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_mul_ps(x, _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23)));
}
inline F32x16 scalef(F32x16 x, F32x16 n) { return {scalef8(x.lo, n.lo), scalef8(x.hi, n.hi)}; }

// bf16 <-> fp32. fp32 -> bf16 rounds to nearest even by integer ops: (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16,
// a NaN kept a (quiet) NaN; as vcvtneps2bf16, except that a subnormal input keeps its value
inline __m256i bf16_bits8(__m256 v) {  // 8 lanes' bf16 in the low 16 bits of each int32
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i biased = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd);
  const __m256i rounded = _mm256_srli_epi32(biased, 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
inline __m256 from_bf16_8(__m128i words) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(words), 16));
}
inline F32x16 load_bf16(const uint16_t* p) {
  return {from_bf16_8(_mm_loadu_si128((const __m128i*)p)), from_bf16_8(_mm_loadu_si128((const __m128i*)(p + 8)))};
}
inline void store_bf16(uint16_t* p, F32x16 v) {
  // packus keeps 128-bit lanes apart: [lo 0-3, hi 0-3, lo 4-7, hi 4-7], then the 64-bit quarters in order
  const __m256i packed = _mm256_packus_epi32(bf16_bits8(v.lo), bf16_bits8(v.hi));
  _mm256_storeu_si256((__m256i*)p, _mm256_permute4x64_epi64(packed, 0xD8));
}
inline F32x16 round_bf16(F32x16 v) {  // to the nearest bf16 (even on ties), back in fp32
  return {_mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits8(v.lo), 16)),
          _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits8(v.hi), 16))};
}
inline F32x16 load_fp16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)),
          _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)))};
}

// masks
inline Mask16 first_lanes(int64_t n) {
  const __m256i count = _mm256_set1_epi32(static_cast<int32_t>(n < 16 ? n : 16));
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return {_mm256_castsi256_ps(_mm256_cmpgt_epi32(count, index)),
          _mm256_castsi256_ps(_mm256_cmpgt_epi32(count, _mm256_add_epi32(index, _mm256_set1_epi32(8))))};
}
inline Mask16 less(F32x16 a, F32x16 b) {
  return {_mm256_cmp_ps(a.lo, b.lo, _CMP_LT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_LT_OQ)};
}
inline F32x16 load_masked(Mask16 m, const float* p) {  // 0 outside m; lanes outside m are not read
  return {_mm256_maskload_ps(p, _mm256_castps_si256(m.lo)), _mm256_maskload_ps(p + 8, _mm256_castps_si256(m.hi))};
}
inline void store_masked(float* p, Mask16 m, F32x16 v) {
  _mm256_maskstore_ps(p, _mm256_castps_si256(m.lo), v.lo);
  _mm256_maskstore_ps(p + 8, _mm256_castps_si256(m.hi), v.hi);
}
inline F32x16 keep(Mask16 m, F32x16 v) { return {_mm256_and_ps(m.lo, v.lo), _mm256_and_ps(m.hi, v.hi)}; }
inline F32x16 select(Mask16 m, F32x16 yes, F32x16 no) {
  return {_mm256_blendv_ps(no.lo, yes.lo, m.lo), _mm256_blendv_ps(no.hi, yes.hi, m.hi)};
}

// int32 lanes
inline I32x16 zero_i() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline I32x16 splat_i(int32_t v) { return {_mm256_set1_epi32(v), _mm256_set1_epi32(v)}; }
inline I32x16 add(I32x16 a, I32x16 b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline I32x16 min(I32x16 a, I32x16 b) { return {_mm256_min_epi32(a.lo, b.lo), _mm256_min_epi32(a.hi, b.hi)}; }
inline I32x16 max(I32x16 a, I32x16 b) { return {_mm256_max_epi32(a.lo, b.lo), _mm256_max_epi32(a.hi, b.hi)}; }
inline int32_t reduce_add(I32x16 v) {
  const __m256i s8 = _mm256_add_epi32(v.lo, v.hi);
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}
inline F32x16 to_float(I32x16 v) { return {_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }
inline I32x16 to_int(F32x16 v) { return {_mm256_cvtps_epi32(v.lo), _mm256_cvtps_epi32(v.hi)}; }  // nearest even
inline I32x16 load_i(const void* p) {
  return {_mm256_loadu_si256((const __m256i*)p), _mm256_loadu_si256((const __m256i*)p + 1)};
}
inline void store_i8(int8_t* p, I32x16 v) {  // |v| <= 127: the saturating packs keep every value
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(v.lo, v.hi), 0xD8);  // lanes 0-15 in order
  _mm_storeu_si128((__m128i*)p, _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
}

// fp64: 8 lanes as two halves of 4; lane i is lane i of the AVX512 build (rescore.cpp sums them in order)
inline F64x8 zero_d() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
inline F64x8 widen(const float* p) { return {_mm256_cvtps_pd(_mm_loadu_ps(p)), _mm256_cvtps_pd(_mm_loadu_ps(p + 4))}; }
inline F64x8 fmadd(F64x8 a, F64x8 b, F64x8 c) {
  return {_mm256_fmadd_pd(a.lo, b.lo, c.lo), _mm256_fmadd_pd(a.hi, b.hi, c.hi)};
}
inline void storeu(double* p, F64x8 v) {
  _mm256_storeu_pd(p, v.lo);
  _mm256_storeu_pd(p + 4, v.hi);
}

#endif

// The LM head's int8 step (int4_amx.cpp: int8_vnni): acc += the 16 columns' 4 codes w against one pass's 4
// bytes u of a row, broadcast. AVX512-VNNI: vpdpbusd of u = q + 128 (unsigned) and w (signed): sum u * w, whose
// offset 128 * colsum the caller takes off in fp32 (kHeadOffset). AVX2: vpmaddubsw of u and w would saturate
// (2 * 255 * 127 > 32767), so it takes the signed q = u ^ 0x80 against |w|, w's sign moved onto q (vpsignb; q
// and w in -127..127): each int16 a pair |q * w + q' * w'| <= 2 * 127 * 127 = 32258, exact, then vpmaddwd with
// ones into int32. That sum is sum q * w = sum u * w - 128 * colsum exactly, so there is no offset to take off.
#if defined(__AVX512F__)
constexpr bool kHeadOffset = true;
inline I32x16 head_dot(I32x16 acc, int32_t u, I32x16 w) {
  return _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(u), w);
}
#else
constexpr bool kHeadOffset = false;
inline __m256i head_dot8(__m256i acc, __m256i q, __m256i w) {
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
inline I32x16 head_dot(I32x16 acc, int32_t u, I32x16 w) {
  const __m256i q = _mm256_set1_epi32(u ^ static_cast<int32_t>(0x80808080u));
  return {head_dot8(acc.lo, q, w.lo), head_dot8(acc.hi, q, w.hi)};
}
#endif

// exp(x) for x <= 0 (softmax and SiLU's exp(-|g|)): 2^n * p(r), r = x - n ln2, a degree-6 polynomial; one fixed
// sequence of operations per element
inline F32x16 exp_neg(F32x16 x) {
  x = max(x, splat(-87.0f));  // so n >= -126: 2^n a normal fp32 (simd.h's AVX2 scalef builds it)
  const F32x16 n = round_even(mul(x, splat(1.44269504088896341f)));
  F32x16 r = fnmadd(n, splat(0.693359375f), x);
  r = fnmadd(n, splat(-2.12194440e-4f), r);
  F32x16 p = splat(1.9875691500e-4f);
  p = fmadd(p, r, splat(1.3981999507e-3f));
  p = fmadd(p, r, splat(8.3334519073e-3f));
  p = fmadd(p, r, splat(4.1665795894e-2f));
  p = fmadd(p, r, splat(1.6666665459e-1f));
  p = fmadd(p, r, splat(5.0000001201e-1f));
  p = fmadd(p, mul(r, r), add(r, splat(1.0f)));
  return scalef(p, n);
}

}  // namespace te
