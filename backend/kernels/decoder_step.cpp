// The whole decoder stack of a step as one native call (`decoder_step`): per layer RMSNorm, the fused QKV
// projection, RoPE, the K/V written into the paged pool, attention over each token's own keys, the output
// projection and residual, RMSNorm, the fused gate/up projection, SiLU-gate, the down projection and residual.
// The projections are int4_mm's own VNNI product (int4_core.h), so they give int4_mm's bits.
//
// Why: a batch-1 decode step of a small model is bound by per-op overhead in torch (about 35 ops a layer, each
// dispatched, allocated and, from Python, interpreted); here a layer is a few loops over preallocated buffers.
//
// Batch invariance by construction: every value a token computes is one fixed sequence of operations over its
// own row (norms: 16 fp32 lanes then one fixed reduction; RoPE, SiLU and the residual adds: elementwise), its
// own keys (attention: its L = position + 1 keys in order, one fixed exp, one fixed sum), and its own
// columns (int4: exact integer sums, then one fixed fold). Which thread runs it, how many other tokens share
// the call, prefill or decode: none of it reaches the arithmetic. The model's Python layers
// (backend/model/layers.py) stay its one definition and the test oracle; this step computes the same math
// with its own rounding in the norms, the softmax and SiLU (tests/backend/test_native_step.py).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attend.h"
#include "int4_core.h"
#include "team.h"

namespace {

using namespace te;

// y = bf16(x * rsqrt(mean(x^2) + eps) * w) for one row of `h` floats (h a multiple of 16)
void rms_norm_row(const float* x, const float* w, int64_t h, float eps, uint16_t* y) {
  F32x16 acc = zero();
  for (int64_t i = 0; i < h; i += 16) acc = fmadd(loadu(x + i), loadu(x + i), acc);
  const float inv = 1.0f / std::sqrt(reduce_add(acc) / static_cast<float>(h) + eps);
  const F32x16 s = splat(inv);
  for (int64_t i = 0; i < h; i += 16) store_bf16(y + i, mul(mul(loadu(x + i), s), loadu(w + i)));
}

// How the step's ops spread over the threads (team.h). Fork: at::parallel_for per op, and steps of fewer tokens
// on the calling thread alone: a decode step's 150 fork/joins (4 projections and the attention per layer) cost
// more than a second thread gains on a shared 2-core machine, where the other core is also the server's event
// loop's (SmolLM2 batch 1 over HTTP, 2 threads: 60 tok/s with them, against 1 thread's 172). A team (pool or
// region) posts each op to threads already running instead, at every token count. A row's bits never depend on
// the threads: each output is computed by one thread, in one fixed order.
constexpr int64_t kParallelTokens = 16;
// a team's runs of a projection hold at least this many bytes of codes and factors: a run claimed costs a cache
// line passed between cores, worth it for a few microseconds of streaming, not for one block of a small model's
// projection (SmolLM2's are 5.6 KB a block)
constexpr int64_t kRunBytes = 64 * 1024;

struct Exec {
  Team* team;  // null: fork
  int threads;
  int64_t tokens;
  // fn(begin, end) over [0, n) items of the op's own kind (column blocks, (token, KV head) pairs)
  template <class F>
  void run(int64_t n, int64_t grain, const F& fn) const {
    if (team != nullptr) return team->run(n, grain, threads, fn);
    at::parallel_for(0, n, tokens >= kParallelTokens ? grain : n, fn);
  }
  // fn(begin, end) over [0, n) items of work too small to fork for: the calling thread alone unless a team runs
  template <class F>
  void light(int64_t n, int64_t grain, const F& fn) const {
    if (team != nullptr) return team->run(n, grain, threads, fn);
    fn(int64_t{0}, n);
  }
};

struct Int4Weight {
  Panel panel;
  int64_t n;
};

Int4Weight weight_of(const at::Tensor& codes, const at::Tensor& factors) {
  TORCH_CHECK(factors.dim() == 4 && (factors.size(2) == 1 || factors.size(2) == 2) &&
                  factors.size(1) == codes.size(1), "factors: [N / 16, K / 32, 1 or 2, 16] fp16");
  return {{codes.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(factors.data_ptr()), codes.size(1),
           factors.size(2)},
          codes.size(0) * kLanes};
}

// scratch for one projection's quantized rows: a [M, 2, K] int8, s [M, G, 2] and xs [M, G] fp32
struct Scratch {
  std::vector<int8_t> a;
  std::vector<float> s;
};

// x [T, H] fp32 += bf16 y, columns [begin, end) of each row (ld: the row length of both)
void residual(float* x, const uint16_t* y, int64_t rows, int64_t ld, int64_t begin, int64_t end) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = r * ld + begin; i < r * ld + end; i += 16)
      storeu(x + i, add(loadu(x + i), load_bf16(y + i)));
}

// y [m, n] bf16 = x [m, k] bf16 @ W.T: int4_mm's VNNI product (the same bits); with `sum`, sum [m, n] fp32 += y
// too, each thread over the columns it computed
void project(const Exec& ex, const uint16_t* x, int64_t m, int64_t k, const Int4Weight& w, Scratch& sc, uint16_t* y,
             float* sum = nullptr) {
  const int64_t groups = k / kGroup;
  sc.a.resize(m * 2 * k);
  sc.s.resize(m * groups * 3);
  float* xs = sc.s.data() + m * groups * 2;
  ex.light(m, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      quantize_row(x + r * k, groups, sc.a.data() + r * 2 * k, sc.a.data() + (r * 2 + 1) * k,
                   sc.s.data() + r * groups * 2, xs + r * groups);
  });
  const Quantized q{sc.a.data(), sc.s.data(), xs, k, groups};
  ex.run(w.n / kLanes, std::max<int64_t>(1, kRunBytes / (groups * (kGroupBytes + 2 * w.panel.planes * kLanes))),
         [&](int64_t begin, int64_t end) {
    vnni_blocks(w.panel, q, m, begin, end, y, w.n);
    if (sum != nullptr) residual(sum, y, m, w.n, begin * kLanes, end * kLanes);
  });
}

// RoPE on q and k (half split: x * [cos | cos] + [x2 | x1] * [-sin | sin], in fp32), q into `q`, k and v
// into the caches at each token's slot
void rope_and_write(const uint16_t* qkv, const float* cos, const float* sin, const Dims& d, const Paged& pg,
                    uint16_t* q, uint16_t* kc, uint16_t* vc, int64_t begin, int64_t end) {
  const int64_t dim = d.head_dim, half = dim / 2, width = (d.heads + 2 * d.kv_heads) * dim;
  float xf[256];  // the head's values twice: [x1 | x2 | x1 | x2], so [x2 | x1] starts at half (dim <= 128)
  for (int64_t t = begin; t < end; ++t) {
    const float* c = cos + t * dim;
    const float* s = sin + t * dim;
    for (int64_t h = 0; h < d.heads + d.kv_heads; ++h) {
      const uint16_t* src = qkv + t * width + h * dim;
      for (int64_t i = 0; i < dim; i += 16) {
        storeu(xf + i, load_bf16(src + i));
        storeu(xf + dim + i, load_bf16(src + i));
      }
      uint16_t* dst = h < d.heads ? q + (t * d.heads + h) * dim : kc + (pg.slots[t] * d.kv_heads + h - d.heads) * dim;
      for (int64_t i = 0; i < dim; i += 16) {
        const F32x16 a = mul(loadu(xf + i), loadu(c + i));
        const F32x16 b = mul(loadu(xf + half + i), loadu(s + i));
        store_bf16(dst + i, add(a, b));
      }
    }
    const uint16_t* v = qkv + t * width + (d.heads + d.kv_heads) * dim;
    std::copy_n(v, d.kv_heads * dim, vc + pg.slots[t] * d.kv_heads * dim);
  }
}

// y = bf16(bf16(silu(gate)) * up) over [T, 2I] rows [gate | up] -> [T, I] (SiLU as g / (1 + exp(-g))), items
// [begin, end) of 16 columns each, row after row
void silu_gate(const uint16_t* gu, int64_t inter, uint16_t* y, int64_t begin, int64_t end) {
  const int64_t per_row = inter / 16;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t t = item / per_row, i = item % per_row * 16;
    const F32x16 g = load_bf16(gu + t * 2 * inter + i);
    const F32x16 e = exp_neg(sub(zero(), abs(g)));  // exp(-|g|)
    // sigmoid(g) = 1 / (1 + exp(-g)) for g >= 0, exp(g) / (1 + exp(g)) below
    const F32x16 r = div(splat(1.0f), add(splat(1.0f), e));
    const F32x16 act = round_bf16(mul(g, select(less(g, zero()), mul(r, e), r)));  // F.silu's bf16 output
    store_bf16(y + t * inter + i, mul(act, load_bf16(gu + t * 2 * inter + inter + i)));
  }
}

// one layer over every token of the step, x updated in place; w: norm_in, norm_post, then (codes, factors) of
// qkv, o, gate_up, down
struct Buffers {
  std::vector<uint16_t> h, qkv, q, attn, out, gu, act;
  Scratch scratch;
};

void layer(const Exec& ex, float* x, const at::Tensor* w, const float* cos, const float* sin, const Dims& d,
           const Paged& pg, uint16_t* kc, uint16_t* vc, Buffers& b) {
  const int64_t t = d.tokens, hid = d.hidden, q_dim = d.heads * d.head_dim;
  const Int4Weight qkv = weight_of(w[2], w[3]), o = weight_of(w[4], w[5]);
  const Int4Weight gate_up = weight_of(w[6], w[7]), down = weight_of(w[8], w[9]);
  const auto norm = [&](const float* weight) {
    ex.light(t, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) rms_norm_row(x + r * hid, weight, hid, d.eps, b.h.data() + r * hid);
    });
  };
  norm(w[0].data_ptr<float>());
  project(ex, b.h.data(), t, hid, qkv, b.scratch, b.qkv.data());
  ex.light(t, 1, [&](int64_t begin, int64_t end) {
    rope_and_write(b.qkv.data(), cos, sin, d, pg, b.q.data(), kc, vc, begin, end);
  });
  // items: (token, query head); a head's scores, softmax and sum are its own, whoever runs its neighbours
  const int64_t group = d.heads / d.kv_heads;
  ex.run(t * d.heads, 1, [&](int64_t begin, int64_t end) {
    thread_local AttendScratch scratch;
    for (int64_t i = begin; i < end;) {  // the run's heads of one (token, KV head) at a time
      const int64_t token = i / d.heads, head = i % d.heads, g = head / group;
      const int64_t stop = std::min(end, token * d.heads + (g + 1) * group);
      attend_one(b.q.data(), kc, vc, d, pg, token, g, head % group, head % group + stop - i, scratch, b.attn.data());
      i = stop;
    }
  });
  project(ex, b.attn.data(), t, q_dim, o, b.scratch, b.out.data(), x);  // and the residual
  norm(w[1].data_ptr<float>());
  project(ex, b.h.data(), t, hid, gate_up, b.scratch, b.gu.data());
  ex.light(t * d.inter / 16, 32, [&](int64_t begin, int64_t end) {
    silu_gate(b.gu.data(), d.inter, b.act.data(), begin, end);
  });
  project(ex, b.act.data(), t, d.inter, down, b.scratch, b.out.data(), x);  // and the residual
}

// per token: its sequence (by query_start) and its key count, context_len - (tokens of its sequence after it)
void locate(Paged& pg, const at::Tensor& query_start, const at::Tensor& context_lens, int64_t tokens) {
  const int32_t* qs = query_start.data_ptr<int32_t>();
  const int32_t* cl = context_lens.data_ptr<int32_t>();
  pg.seq.resize(tokens);
  pg.keys.resize(tokens);
  for (int64_t s = 0; s < context_lens.size(0); ++s)
    for (int64_t t = qs[s]; t < qs[s + 1]; ++t) {
      pg.seq[t] = s;
      pg.keys[t] = cl[s] - (qs[s + 1] - 1 - t);
    }
}

// x [T, hidden] fp32 -> the residual stream after every layer, [T, hidden] fp32
at::Tensor decoder_step(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                        const at::Tensor& query_start, const at::Tensor& context_lens, const at::Tensor& block_tables,
                        at::TensorList k_caches, at::TensorList v_caches, at::TensorList weights,
                        at::IntArrayRef dims, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: [T, hidden] fp32");
  TORCH_CHECK(dims.size() == 5, "dims: heads, kv_heads, head_dim, intermediate, block_size");
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 10 * layers && v_caches.size() == k_caches.size(),
              "weights: 10 per layer");
  const Dims d{x.size(0), x.size(1), dims[0], dims[1], dims[2], dims[3], dims[4], static_cast<float>(eps)};
  TORCH_CHECK(d.hidden % kGroup == 0 && d.inter % kGroup == 0 && d.head_dim % 16 == 0 && d.head_dim <= 128 &&
                  d.heads % d.kv_heads == 0, "unsupported dims");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && cos.numel() == d.tokens * d.head_dim &&
                  sin.is_contiguous() && sin.numel() == cos.numel(), "cos, sin: [T, head_dim] fp32");
  TORCH_CHECK(slots.scalar_type() == at::kLong && block_tables.scalar_type() == at::kInt &&
                  query_start.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt &&
                  block_tables.is_contiguous(), "slots int64; block tables, query starts, context lens int32");
  at::Tensor out = x.clone();
  Paged pg{slots.data_ptr<int64_t>(), block_tables.data_ptr<int32_t>(), block_tables.size(1), {}, {}};
  locate(pg, query_start, context_lens, d.tokens);
  const int64_t t = d.tokens, q_dim = d.heads * d.head_dim;
  Buffers b;
  b.h.resize(t * std::max(d.hidden, d.inter));
  b.qkv.resize(t * (q_dim + 2 * d.kv_heads * d.head_dim));
  b.q.resize(t * q_dim);
  b.attn.resize(t * q_dim);
  b.out.resize(t * d.hidden);
  b.gu.resize(t * 2 * d.inter);
  b.act.resize(t * d.inter);
  for (int64_t l = 0; l < layers; ++l)
    TORCH_CHECK(k_caches[l].scalar_type() == at::kBFloat16 && k_caches[l].is_contiguous() &&
                    v_caches[l].scalar_type() == at::kBFloat16 && v_caches[l].is_contiguous(), "caches: bf16");
  const auto stack = [&](const Exec& ex) {
    for (int64_t l = 0; l < layers; ++l)
      layer(ex, out.data_ptr<float>(), weights.data() + 10 * l, cos.data_ptr<float>(), sin.data_ptr<float>(), d,
            pg, reinterpret_cast<uint16_t*>(k_caches[l].data_ptr()),
            reinterpret_cast<uint16_t*>(v_caches[l].data_ptr()), b);
  };
  const int threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  switch (threading_mode()) {
    case Threading::kFork:
      stack(Exec{nullptr, threads, t});
      break;
    case Threading::kPool:
      stack(Exec{threads > 1 ? &pool_team(threads) : nullptr, threads, t});
      break;
    case Threading::kRegion: {
      Team team;
      if (threads > 1)
        in_region(threads, team, [&] { stack(Exec{&team, threads, t}); });
      else
        stack(Exec{&team, 1, t});
      break;
    }
  }
  return out;
}

// the threading of the step and of the head's VNNI rows (team.h), and its tuning: how long an idle worker spins
// (microseconds) and the runs' split (items of a run: at most the items left / (split * threads))
void set_step_threading(const std::string& mode, int64_t spin_us, int64_t split) {
  TORCH_CHECK(mode == "fork" || mode == "pool" || mode == "region", "threading: fork, pool or region, not ", mode);
  TORCH_CHECK(spin_us >= 0 && split >= 1, "spin_us >= 0, split >= 1");
  threading().mode.store(static_cast<int>(mode == "fork" ? Threading::kFork
                                          : mode == "pool" ? Threading::kPool
                                                           : Threading::kRegion));
  threading().spin_us.store(static_cast<int>(spin_us));
  threading().split.store(static_cast<int>(split));
}

// items of the teams' ops run by their workers since the library loaded (a test sees the second thread work)
int64_t step_threading_worker_items() { return threading().worker_items.load(); }

// x [N, 16] fp32, N a multiple of 8 -> [2, N]: each row's reduce_add * scale, then the same through reduce_add8, 8
// rows at a time (attention's scores take either path by where a key falls: a test holds them to the same bits)
at::Tensor reduce_sums(const at::Tensor& x, double scale) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == 16 && x.size(0) % 8 == 0 && x.scalar_type() == at::kFloat &&
                  x.is_contiguous(), "x: [8n, 16] fp32");
  const int64_t n = x.size(0);
  at::Tensor out = at::empty({2, n}, x.options());
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  for (int64_t r = 0; r < n; ++r) po[r] = reduce_add(loadu(px + r * 16)) * s;
  for (int64_t r = 0; r < n; r += 8) {
    F32x16 v[8];
    for (int64_t k = 0; k < 8; ++k) v[k] = loadu(px + (r + k) * 16);
    reduce_add8(v, s, po + n + r);
  }
  return out;
}

}  // namespace

#ifndef TE_NAMESPACE
#define TE_NAMESPACE tokenedge
#endif

TORCH_LIBRARY_FRAGMENT(TE_NAMESPACE, m) {
  m.def(
      "decoder_step(Tensor x, Tensor cos, Tensor sin, Tensor slots, Tensor query_start, Tensor context_lens, "
      "Tensor block_tables, Tensor[] k_caches, Tensor[] v_caches, Tensor[] weights, int[] dims, float eps) -> Tensor");
  // no tensor argument to dispatch on: a catch-all kernel
  m.def("set_step_threading(str mode, int spin_us=100, int split=1) -> ()", &set_step_threading);
  m.def("step_threading_worker_items() -> int", &step_threading_worker_items);
  m.def("reduce_sums(Tensor x, float scale) -> Tensor", &reduce_sums);
}

TORCH_LIBRARY_IMPL(TE_NAMESPACE, CPU, m) { m.impl("decoder_step", &decoder_step); }
