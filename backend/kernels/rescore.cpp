// The greedy LM head's exact step (`rescore`, backend/model/head.py's RescoredHead): given approximate logits and a
// bound on their error, every token whose approximation could still be its row's maximum is rescored exactly, in
// fp64, from the fp32 output matrix. In torch this was a gather of the candidates' rows, two casts, a product and
// a sum (about 1 ms a step at batch 1 on SmolLM2); here it is one pass over the row and a dot product per
// candidate, in one fixed order per (row, token): batch-invariant by construction, like the rest of the library.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "simd.h"

namespace {

// sum_k w[k] * h[k] in fp64: 8 lanes over k, then the lanes in one fixed order (the same bits in both builds:
// simd.h's AVX2 F64x8 is the same 8 lanes in two halves)
double dot_fp64(const float* w, const float* h, int64_t k) {
  te::F64x8 acc = te::zero_d();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) acc = te::fmadd(te::widen(w + i), te::widen(h + i), acc);
  double lanes[8];
  te::storeu(lanes, acc);
  double total = 0.0;
  for (double lane : lanes) total += lane;
  for (; i < k; ++i) total += static_cast<double>(w[i]) * static_cast<double>(h[i]);
  return total;
}

// approx [N, V] fp32, rewritten in place: every (row, token) with approx + bound >= max over the row of
// (approx - bound) gets the exact logit hidden[row] . weight[token] (fp64, rounded to fp32)
void rescore(at::Tensor approx, const at::Tensor& bound, const at::Tensor& hidden, const at::Tensor& weight) {
  TORCH_CHECK(approx.dim() == 2 && approx.scalar_type() == at::kFloat && approx.is_contiguous(), "approx: [N, V] fp32");
  TORCH_CHECK(bound.sizes() == approx.sizes() && bound.scalar_type() == at::kFloat && bound.is_contiguous(),
              "bound: as approx");
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(0) == approx.size(0) && hidden.scalar_type() == at::kFloat &&
                  hidden.is_contiguous(), "hidden: [N, H] fp32");
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == approx.size(1) && weight.size(1) == hidden.size(1) &&
                  weight.scalar_type() == at::kFloat && weight.is_contiguous(), "weight: [V, H] fp32");
  const int64_t rows = approx.size(0), vocab = approx.size(1), k = hidden.size(1);
  float* a = approx.data_ptr<float>();
  const float* b = bound.data_ptr<float>();
  const float* h = hidden.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float* ar = a + r * vocab;
    const float* br = b + r * vocab;
    float floor = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < vocab; ++v) floor = std::max(floor, ar[v] - br[v]);
    for (int64_t v = 0; v < vocab; ++v)
      if (ar[v] + br[v] >= floor) ar[v] = static_cast<float>(dot_fp64(w + v * k, h + r * k, k));
  }
}

}  // namespace

#ifndef TE_NAMESPACE
#define TE_NAMESPACE tokenedge
#endif

TORCH_LIBRARY_FRAGMENT(TE_NAMESPACE, m) { m.def("rescore(Tensor(a!) approx, Tensor bound, Tensor hidden, Tensor weight) -> ()"); }

TORCH_LIBRARY_IMPL(TE_NAMESPACE, CPU, m) { m.impl("rescore", &rescore); }
