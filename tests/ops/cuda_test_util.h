// Helpers for the CUDA twin tests: fresh random inputs, uploads in a chosen dtype, poisoned
// outputs, relative L2 error, the paged-attention metadata of a batch, and MoE routings.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/device_buffer.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/attention_meta.h"

namespace osprey::testing {

#define OSPREY_REQUIRE_GPU()                                                   \
  do {                                                                         \
    if (::osprey::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// Fresh inputs on every run; the seed is printed so that a failure can be replayed.
inline std::mt19937_64& rng() {
  static std::mt19937_64 g = [] {
    const uint64_t seed = std::random_device{}();
    std::printf("random seed %llu\n", static_cast<unsigned long long>(seed));
    return std::mt19937_64(seed);
  }();
  return g;
}

inline Buffer rand_f32(Shape s, float lo = -1.0f, float hi = 1.0f) {
  Buffer b(DType::F32, std::move(s));
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < b.numel(); ++i) b.f32()[i] = d(rng());
  return b;
}

// Rounds every value to the nearest BF16 (so that a BF16 upload is exact).
inline void round_bf16(Buffer& b) {
  for (int64_t i = 0; i < b.numel(); ++i) b.f32()[i] = bf16_to_f32(f32_to_bf16(b.f32()[i]));
}

// A device copy of an F32 host tensor in dtype dt (F32 or BF16).
inline DeviceBuffer upload(const Tensor& host, DType dt = DType::F32) {
  if (dt == DType::F32 || host.dtype != DType::F32) return cuda::to_device(host);
  Buffer h(DType::BF16, host.shape);
  for (int64_t i = 0; i < host.numel(); ++i) h.ptr<uint16_t>()[i] = f32_to_bf16(host.f32()[i]);
  return cuda::to_device(h);
}

// A device output of dtype dt filled with NaN bytes (0xff) so that unwritten elements show.
inline DeviceBuffer poisoned(DType dt, Shape s) {
  DeviceBuffer d(dt, std::move(s));
  cuda::fill_bytes(d, 0xff);
  return d;
}

// A host copy of a device tensor; BF16 comes back widened to F32, other dtypes as they are.
inline Buffer download(const Tensor& dev) {
  cuda::synchronize();
  Buffer h = cuda::to_host(dev);
  if (h.dtype() != DType::BF16) return h;
  Buffer f(DType::F32, h.shape());
  for (int64_t i = 0; i < h.numel(); ++i) f.f32()[i] = bf16_to_f32(h.ptr<uint16_t>()[i]);
  return f;
}

// ‖out − ref‖ / ‖ref‖; infinity when out has a NaN or infinity (an unwritten or broken element).
inline double rel_l2(const Tensor& out, const Tensor& ref) {
  EXPECT_EQ(out.numel(), ref.numel());
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double o = out.f32()[i], r = ref.f32()[i];
    if (!std::isfinite(o)) return INFINITY;
    num += (o - r) * (o - r);
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// printf into a std::string (GCC 12 warns, falsely, on chains of std::string + to_string).
template <typename... A>
std::string strf(const char* f, A... a) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}

// Checks the error against the tolerance and prints one summary line (gpu_tests.sh collects them).
inline void expect_close(const std::string& name, const Tensor& out, const Tensor& ref,
                         double tol) {
  const double err = rel_l2(out, ref);
  std::printf("TWIN %-44s rel_err %.3e  tol %.1e  %s\n", name.c_str(), err, tol,
              err <= tol ? "ok" : "FAIL");
  EXPECT_LE(err, tol) << name;
}

// A batch of sequences for the attention-like ops: sequence s has ctx[s] context positions after
// this step, the last n_new[s] of them new (query tokens). Physical blocks are shuffled.
struct Batch {
  AttentionMeta host;
  Buffer qsl, seq_lens, positions, block_table, slot_mapping;
  DeviceBuffer d_qsl, d_seq_lens, d_positions, d_block_table, d_slot_mapping;
  AttentionMeta dev;
  int64_t n_blocks = 0;
  int64_t total_ctx = 0;
};

inline Batch make_batch(const std::vector<int>& ctx, const std::vector<int>& n_new,
                        int block_size = 64) {
  Batch b;
  const int n_seqs = int(ctx.size());
  int max_blocks = 0, n_tokens = 0;
  for (int s = 0; s < n_seqs; ++s) {
    max_blocks = std::max(max_blocks, (ctx[size_t(s)] + block_size - 1) / block_size);
    b.n_blocks += (ctx[size_t(s)] + block_size - 1) / block_size;
    n_tokens += n_new[size_t(s)];
    b.total_ctx += ctx[size_t(s)];
  }
  b.n_blocks += 3;  // a few blocks nobody uses
  b.qsl = Buffer(DType::I32, {n_seqs + 1});
  b.seq_lens = Buffer(DType::I32, {n_seqs});
  b.positions = Buffer(DType::I32, {n_tokens});
  b.block_table = Buffer(DType::I32, {n_seqs, max_blocks});
  b.slot_mapping = Buffer(DType::I64, {n_tokens});
  std::vector<int32_t> phys(size_t(b.n_blocks));
  std::iota(phys.begin(), phys.end(), 0);
  std::shuffle(phys.begin(), phys.end(), rng());
  size_t next = 0;
  int t = 0;
  for (int s = 0; s < n_seqs; ++s) {
    b.qsl.ptr<int32_t>()[s] = t;
    b.seq_lens.ptr<int32_t>()[s] = ctx[size_t(s)];
    const int nb = (ctx[size_t(s)] + block_size - 1) / block_size;
    for (int i = 0; i < max_blocks; ++i)
      b.block_table.ptr<int32_t>()[s * max_blocks + i] = i < nb ? phys[next++] : 0;
    for (int i = 0; i < n_new[size_t(s)]; ++i, ++t) {
      const int p = ctx[size_t(s)] - n_new[size_t(s)] + i;
      b.positions.ptr<int32_t>()[t] = p;
      b.slot_mapping.ptr<int64_t>()[t] =
          int64_t(b.block_table.ptr<int32_t>()[s * max_blocks + p / block_size]) * block_size +
          p % block_size;
    }
  }
  b.qsl.ptr<int32_t>()[n_seqs] = t;
  b.host = AttentionMeta{n_seqs,      n_tokens,      block_size,     b.qsl, b.seq_lens,
                         b.positions, b.block_table, b.slot_mapping, {}};
  b.d_qsl = cuda::to_device(b.qsl);
  b.d_seq_lens = cuda::to_device(b.seq_lens);
  b.d_positions = cuda::to_device(b.positions);
  b.d_block_table = cuda::to_device(b.block_table);
  b.d_slot_mapping = cuda::to_device(b.slot_mapping);
  b.dev = AttentionMeta{n_seqs,        n_tokens,        block_size,       b.d_qsl, b.d_seq_lens,
                        b.d_positions, b.d_block_table, b.d_slot_mapping, {}};
  return b;
}

// DSA top-k rows [n_tokens, k] I32 for a batch, as the indexer's contract lays them out: per token
// min(k, p + 1) distinct attended positions ≤ p first (random order; with `repeats`, every fourth
// entry repeats an earlier one), then −1 padding.
inline Buffer random_topk(const Batch& b, int k, bool repeats = false) {
  Buffer t(DType::I32, {b.host.n_tokens, k});
  for (int i = 0; i < b.host.n_tokens; ++i) {
    const int p = b.positions.ptr<int32_t>()[i];
    std::vector<int32_t> js(size_t(p) + 1);
    std::iota(js.begin(), js.end(), 0);
    std::shuffle(js.begin(), js.end(), rng());
    int32_t* row = t.ptr<int32_t>() + int64_t(i) * k;
    for (int c = 0; c < k; ++c) row[c] = c <= p ? js[size_t(c)] : -1;
    if (repeats)
      for (int c = 3; c < k && c <= p; c += 4) row[c] = row[c / 2];
  }
  return t;
}

// A fast generator for big random tensors (8 random bytes a draw; 16 real-width experts hold 704 M
// values).
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

// K distinct experts per token from `pool`; with `hot` ≥ 0, slot 0 is `hot` for every token.
inline Buffer route_ids(int64_t n, int64_t K, std::vector<int32_t> pool, int32_t hot = -1) {
  Buffer ids(DType::I32, {n, K});
  for (int64_t t = 0; t < n; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng());
    int32_t* row = ids.ptr<int32_t>() + t * K;
    int64_t i = 0;
    if (hot >= 0) row[i++] = hot;
    for (size_t j = 0; i < K; ++j) {
      OSPREY_CHECK(j < pool.size(), "route_ids: ", pool.size(), " experts cannot fill top-", K);
      if (pool[j] != hot) row[i++] = pool[j];
    }
  }
  return ids;
}

// Expert ids [begin, end).
inline std::vector<int32_t> expert_range(int32_t begin, int32_t end) {
  std::vector<int32_t> v(size_t(end - begin));
  std::iota(v.begin(), v.end(), begin);
  return v;
}

}  // namespace osprey::testing
