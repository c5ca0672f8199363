// Attention over the paged KV pool for the native decoder step (decoder_step.cpp): one token's query heads against
// its own keys, in one fixed order per head (see attend_one), whoever runs its neighbours.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace te {

struct Dims {
  int64_t tokens, hidden, heads, kv_heads, head_dim, inter, block_size;
  float eps;
};

struct Paged {
  const int64_t* slots;        // [T] flat slot of each new token
  const int32_t* block_tables; // [B, max_blocks]
  int64_t max_blocks;
  std::vector<int64_t> seq, keys;  // per token: its sequence, and how many keys it sees (position + 1)
};

// What attending keeps between calls on a thread (thread_local in the caller): the run's scores, and where each
// of the token's keys' K and V rows are
struct AttendScratch {
  std::vector<float> scores;
  std::vector<const uint16_t*> k_rows, v_rows;
};
constexpr int64_t kHeadsTogether = 4;  // query heads that share one widening of each K row
constexpr int64_t kPrefetchKeys = 8;   // how far ahead of its products a K row is fetched

// one token's query heads [h_begin, h_end) of KV head g's group against its L keys: softmax(q.k / sqrt(D)) . v,
// out in bf16. Each head computes what it always did, in the same order (per key: its products in lane order from
// one mul, reduce_add's tree, the scale; then the exp pass; then its weighted V rows in key order), so its bits do
// not depend on which heads share a call. Shared: each K row widened to fp32 once for up to kHeadsTogether heads,
// the keys' row addresses found once (block by block), and 8 keys' sums reduced at once (simd.h: reduce_add8).
// Lanes: head_dim / 16, a template argument so that a head's q, a key's widened K row and a head's V sums stay in
// registers (with a run-time count the compiler kept them in memory, one store-to-load wait per key).
template <int64_t lanes>
void attend_lanes(const uint16_t* q, const uint16_t* kc, const uint16_t* vc, const Dims& d, const Paged& pg, int64_t t,
                  int64_t g, int64_t h_begin, int64_t h_end, AttendScratch& sc, uint16_t* out) {
  const int64_t dim = d.head_dim, group = d.heads / d.kv_heads, len = pg.keys[t];
  const int64_t bs = d.block_size, row = d.kv_heads * dim;  // a slot's K (or V) rows, every KV head's
  const int32_t* table = pg.block_tables + pg.seq[t] * pg.max_blocks;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const int64_t stride = (len + 15) / 16 * 16;
  sc.scores.resize(group * stride);
  sc.k_rows.resize(len);
  sc.v_rows.resize(len);
  float* scores = sc.scores.data();
  const uint16_t** k_rows = sc.k_rows.data();
  const uint16_t** v_rows = sc.v_rows.data();
  for (int64_t j0 = 0; j0 < len; j0 += bs) {
    const int64_t first = static_cast<int64_t>(table[j0 / bs]) * bs * row + g * dim;
    for (int64_t j = j0; j < std::min(len, j0 + bs); ++j) {
      k_rows[j] = kc + first + (j - j0) * row;
      v_rows[j] = vc + first + (j - j0) * row;
    }
  }
  for (int64_t c = h_begin; c < h_end; c += kHeadsTogether) {  // q.k: the scores of heads [c, c + n)
    const int64_t n = std::min(kHeadsTogether, h_end - c);
    F32x16 qv[kHeadsTogether][lanes];
    for (int64_t h = 0; h < n; ++h)
      for (int64_t i = 0; i < lanes; ++i) qv[h][i] = load_bf16(q + (t * d.heads + g * group + c + h) * dim + i * 16);
    const auto dots = [&](int64_t j, F32x16* acc, int64_t step) {  // key j's products, each head's at acc[h * step]
      if (c == h_begin) {  // the rows are in memory, not cache (a step streams the weights): ask for them early
        const char* k_ahead = reinterpret_cast<const char*>(k_rows[std::min(j + kPrefetchKeys, len - 1)]);
        const char* v_row = reinterpret_cast<const char*>(v_rows[j]);
        for (int64_t line = 0; line < dim * 2; line += 64) {
          _mm_prefetch(k_ahead + line, _MM_HINT_T0);
          _mm_prefetch(v_row + line, _MM_HINT_T1);
        }
      }
      F32x16 kf[lanes];
      for (int64_t i = 0; i < lanes; ++i) kf[i] = load_bf16(k_rows[j] + i * 16);
      for (int64_t h = 0; h < n; ++h) {
        F32x16 a = mul(qv[h][0], kf[0]);
        for (int64_t i = 1; i < lanes; ++i) a = fmadd(qv[h][i], kf[i], a);
        acc[h * step] = a;
      }
    };
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
      F32x16 acc[kHeadsTogether][8];
      for (int64_t k = 0; k < 8; ++k) dots(j + k, &acc[0][k], 8);
      for (int64_t h = 0; h < n; ++h) reduce_add8(acc[h], scale, scores + (c + h) * stride + j);
    }
    for (; j < len; ++j) {
      F32x16 acc[kHeadsTogether];
      dots(j, acc, 1);
      for (int64_t h = 0; h < n; ++h) scores[(c + h) * stride + j] = reduce_add(acc[h]) * scale;
    }
  }
  for (int64_t h = h_begin; h < h_end; ++h) {
    float* sh = scores + h * stride;
    float best = sh[0];
    for (int64_t j = 1; j < len; ++j) best = std::max(best, sh[j]);
    F32x16 total = zero();
    for (int64_t j = 0; j < len; j += 16) {
      const Mask16 live = first_lanes(len - j);
      const F32x16 e = exp_neg(sub(load_masked(live, sh + j), splat(best)));
      store_masked(sh + j, live, e);
      total = add(total, keep(live, e));
    }
    F32x16 acc[lanes];
    for (int64_t i = 0; i < lanes; ++i) acc[i] = zero();
    for (int64_t j = 0; j < len; ++j) {
      const F32x16 p = splat(sh[j]);
      for (int64_t i = 0; i < lanes; ++i) acc[i] = fmadd(p, load_bf16(v_rows[j] + i * 16), acc[i]);
    }
    const F32x16 inv = splat(1.0f / reduce_add(total));
    uint16_t* oh = out + (t * d.heads + g * group + h) * dim;
    for (int64_t i = 0; i < lanes; ++i) store_bf16(oh + i * 16, mul(acc[i], inv));
  }
}

inline void attend_one(const uint16_t* q, const uint16_t* kc, const uint16_t* vc, const Dims& d, const Paged& pg,
                       int64_t t, int64_t g, int64_t h_begin, int64_t h_end, AttendScratch& sc, uint16_t* out) {
  switch (d.head_dim / 16) {  // decoder_step checks head_dim: a multiple of 16, at most 128
    case 1: return attend_lanes<1>(q, kc, vc, d, pg, t, g, h_begin, h_end, sc, out);
    case 2: return attend_lanes<2>(q, kc, vc, d, pg, t, g, h_begin, h_end, sc, out);
    case 3: return attend_lanes<3>(q, kc, vc, d, pg, t, g, h_begin, h_end, sc, out);
    case 4: return attend_lanes<4>(q, kc, vc, d, pg, t, g, h_begin, h_end, sc, out);
    case 5: return attend_lanes<5>(q, kc, vc, d, pg, t, g, h_begin, h_end, sc, out);
    case 6: return attend_lanes<6>(q, kc, vc, d, pg, t, g, h_begin, h_end, sc, out);
    case 7: return attend_lanes<7>(q, kc, vc, d, pg, t, g, h_begin, h_end, sc, out);
    default: return attend_lanes<8>(q, kc, vc, d, pg, t, g, h_begin, h_end, sc, out);
  }
}

}  // namespace te
