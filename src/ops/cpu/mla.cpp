// CPU MLA: the q·k products and the weighted sums of values as BLAS sgemms (per head over a
// block of a sequence's tokens for the expanded form, per token over its attended rows for the
// absorbed one), softmax in F32 with the max subtracted, its sum in F64. The FP8 (U8) latent cache
// format of ops/mla.h is written and read with plain loops: the reference for the CUDA twin. Reads
// dequantize the rows first, then run the same arithmetic as for an F32 cache holding the
// dequantized values.
#include "ops/mla.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/storage.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/tensor_ops.h"

namespace osprey::ops::cpu {

namespace {

// Tokens of a sequence attended together by the expanded form: scores holds [block, context]
// floats per head (8,192 positions: 2 MiB).
constexpr int64_t kMlaTokenBlock = 64;

// Row of position j of sequence s in a paged cache.
int64_t cache_row(const AttentionMeta& m, int s, int64_t j) {
  const int64_t max_blocks = m.block_table.size(1);
  OSPREY_CHECK(j / m.block_size < max_blocks, "position ", j, " beyond the block table");
  const int32_t block = m.block_table.ptr<int32_t>()[s * max_blocks + j / m.block_size];
  return int64_t(block) * m.block_size + j % m.block_size;
}

// The context positions token t attends: all j ≤ p, or the top-k entries (≤ p) when given.
void attended(std::vector<int64_t>& js, const Tensor& topk, int64_t t, int64_t p) {
  js.clear();
  if (topk.data == nullptr) {
    for (int64_t j = 0; j <= p; ++j) js.push_back(j);
    return;
  }
  const int64_t k = topk.size(1);
  const int32_t* row = topk.ptr<int32_t>() + t * k;
  for (int64_t i = 0; i < k; ++i)
    if (row[i] >= 0 && row[i] <= p) js.push_back(row[i]);
  std::sort(js.begin(), js.end());
}

// FP8 cache: checks a U8 cache [n_blocks, block_size, bytes] against kv_lora + rope.
void check_fp8_cache(const Tensor& c, int64_t kv_lora, int64_t rope) {
  OSPREY_CHECK(mla_fp8_supported(kv_lora, rope),
               "FP8 latent cache: kv_lora must be a multiple of 128 and rope even, got ", kv_lora,
               " + ", rope);
  OSPREY_CHECK(c.dtype == DType::U8 && c.size(-1) == mla_fp8_token_bytes(kv_lora, rope),
               "FP8 latent cache row of ", c.size(-1), " bytes, want ",
               mla_fp8_token_bytes(kv_lora, rope), " for ", kv_lora, " + ", rope);
}

// One token into its FP8 row dst [mla_fp8_token_bytes]: per 128-value tile amax, scale, RNE e4m3
// values; then the scales; then k_pe as bf16.
void fp8_quantize_row(uint8_t* dst, const float* latent, const float* k_pe, int64_t kv_lora,
                      int64_t rope) {
  const int64_t n_tiles = kv_lora / kMlaFp8Tile;
  for (int64_t i = 0; i < n_tiles; ++i) {
    const float* x = latent + i * kMlaFp8Tile;
    float amax = 0.0f;
    for (int64_t c = 0; c < kMlaFp8Tile; ++c) amax = std::max(amax, std::fabs(x[c]));
    const float s = mla_fp8_scale(amax);
    for (int64_t c = 0; c < kMlaFp8Tile; ++c) dst[i * kMlaFp8Tile + c] = f32_to_e4m3(x[c] / s);
    std::memcpy(dst + kv_lora + 4 * i, &s, 4);
  }
  for (int64_t c = 0; c < rope; ++c) {
    const uint16_t b = f32_to_bf16(k_pe[c]);
    std::memcpy(dst + kv_lora + 4 * n_tiles + 2 * c, &b, 2);
  }
}

// One FP8 row src into out [kv_lora + rope] F32.
void fp8_dequantize_row(float* out, const uint8_t* src, int64_t kv_lora, int64_t rope) {
  const int64_t n_tiles = kv_lora / kMlaFp8Tile;
  for (int64_t i = 0; i < n_tiles; ++i) {
    float s;
    std::memcpy(&s, src + kv_lora + 4 * i, 4);
    for (int64_t c = i * kMlaFp8Tile; c < (i + 1) * kMlaFp8Tile; ++c)
      out[c] = e4m3_to_f32(src[c]) * s;
  }
  for (int64_t c = 0; c < rope; ++c) {
    uint16_t b;
    std::memcpy(&b, src + kv_lora + 4 * n_tiles + 2 * c, 2);
    out[kv_lora + c] = bf16_to_f32(b);
  }
}

int seq_of(const AttentionMeta& m, int64_t t) {
  const int32_t* qsl = m.query_start_loc.ptr<int32_t>();
  int s = 0;
  while (s + 1 < m.n_seqs && qsl[s + 1] <= t) ++s;
  return s;
}

// One query row's attention weights, in place: row[j] (a raw q·k for j in [0, n)) becomes
// softmax(scale · row)[j] over the attended positions js (ascending) and exactly 0 elsewhere (F32
// scores with the max subtracted, F32 exp, F64 sum). Returns log Σ_j e^score_j (natural log, F64
// exp and sum).
float softmax_attended(float* row, int64_t n, const std::vector<int64_t>& js, float scale,
                       std::vector<float>& p) {
  p.resize(js.size());
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < js.size(); ++i) {
    p[i] = row[js[i]] * scale;
    mx = std::max(mx, p[i]);
  }
  double lsum = 0.0, sum = 0.0;
  for (float& v : p) {
    lsum += std::exp(double(v) - mx);
    v = std::exp(v - mx);
    sum += v;
  }
  std::fill_n(row, n, 0.0f);
  for (size_t i = 0; i < js.size(); ++i) row[js[i]] = float(p[i] / sum);
  return mx + float(std::log(lsum));
}

}  // namespace

void mla_absorb_q(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v) {
  const int64_t n = q.size(0), H = q.size(1), qk = q.size(2), rope = qk - nope;
  const int64_t kv_lora = kv_b.size(1), width = q_abs.size(2);
  OSPREY_CHECK(width == kv_lora + rope && kv_b.size(0) == H * (nope + v), "mla_absorb_q shapes");
  const float* W = kv_b.f32();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q.f32() + (t * H + h) * qk;
      float* o = q_abs.f32() + (t * H + h) * width;
      std::fill_n(o, kv_lora, 0.0f);
      for (int64_t d = 0; d < nope; ++d) {
        const float* w = W + (h * (nope + v) + d) * kv_lora;
        for (int64_t c = 0; c < kv_lora; ++c) o[c] += qh[d] * w[c];
      }
      std::copy_n(qh + nope, rope, o + kv_lora);
    }
}

void mla_unabsorb_out(Tensor out, Tensor o_lat, Tensor kv_b, int nope) {
  const int64_t n = o_lat.size(0), H = o_lat.size(1), kv_lora = o_lat.size(2), v = out.size(2);
  OSPREY_CHECK(kv_b.size(0) == H * (nope + v) && kv_b.size(1) == kv_lora, "mla_unabsorb shapes");
  const float* W = kv_b.f32();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* l = o_lat.f32() + (t * H + h) * kv_lora;
      float* o = out.f32() + (t * H + h) * v;
      for (int64_t d = 0; d < v; ++d) {
        const float* w = W + (h * (nope + v) + nope + d) * kv_lora;
        float acc = 0.0f;
        for (int64_t c = 0; c < kv_lora; ++c) acc += l[c] * w[c];
        o[d] = acc;
      }
    }
}

void mla_cache_write(Tensor latent_cache, Tensor latent, Tensor k_pe, const AttentionMeta& m) {
  const int64_t kv_lora = latent.size(-1), rope = k_pe.size(-1);
  const int64_t* slots = m.slot_mapping.ptr<int64_t>();
  if (latent_cache.dtype == DType::U8) {
    check_fp8_cache(latent_cache, kv_lora, rope);
    const int64_t bytes = latent_cache.size(-1), n_slots = latent_cache.numel() / bytes;
    for (int64_t t = 0; t < m.n_tokens; ++t) {
      OSPREY_CHECK(slots[t] >= 0 && slots[t] < n_slots, "slot ", slots[t]);
      fp8_quantize_row(latent_cache.ptr<uint8_t>() + slots[t] * bytes, latent.f32() + t * kv_lora,
                       k_pe.f32() + t * rope, kv_lora, rope);
    }
    return;
  }
  const int64_t width = latent_cache.size(-1);
  OSPREY_CHECK(width == kv_lora + rope, "latent cache width ", width);
  const int64_t n_slots = latent_cache.numel() / width;
  for (int64_t t = 0; t < m.n_tokens; ++t) {
    OSPREY_CHECK(slots[t] >= 0 && slots[t] < n_slots, "slot ", slots[t]);
    float* dst = latent_cache.f32() + slots[t] * width;
    std::copy_n(latent.f32() + t * kv_lora, kv_lora, dst);
    std::copy_n(k_pe.f32() + t * rope, rope, dst + kv_lora);
  }
}

void mla_absorb_q_rope(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v, Tensor positions,
                       Tensor inv_freq, float attention_factor, bool interleaved) {
  const int rope = int(q.size(-1)) - nope;
  ops::cpu::rope(q, nope, rope, positions, inv_freq, attention_factor, interleaved);
  mla_absorb_q(q_abs, q, kv_b, nope, v);
}

void mla_kv_write(Tensor latent_cache, Tensor kv, Tensor norm_w, float eps, Tensor inv_freq,
                  float attention_factor, bool interleaved, const AttentionMeta& m) {
  const int64_t T = kv.size(0), width = kv.size(1);
  const int64_t kv_lora = norm_w.numel(), rope = width - kv_lora;
  OSPREY_CHECK(kv.dim() == 2 && rope > 0 && inv_freq.numel() * 2 == rope && T == m.n_tokens,
               "mla_kv_write: kv ", shape_str(kv.shape), ", norm weight of ", kv_lora,
               ", inv_freq of ", inv_freq.numel(), ", ", m.n_tokens, " tokens");
  const Storage latent(Device::CPU, DType::F32, {T, kv_lora}),  // [T, kv_lora]
      latent_n(Device::CPU, DType::F32, {T, kv_lora}),          // [T, kv_lora]
      k_pe(Device::CPU, DType::F32, {T, 1, rope});              // [T, 1, rope]
  copy_columns(latent, 0, kv, 0, kv_lora);
  copy_columns(k_pe.view().reshape({T, rope}), 0, kv, kv_lora, rope);
  rms_norm(latent_n, latent, norm_w, eps);
  ops::cpu::rope(k_pe, 0, int(rope), m.positions, inv_freq, attention_factor, interleaved);
  mla_cache_write(latent_cache, latent_n, k_pe.view().reshape({T, rope}), m);
}

void mla_cache_gather(Tensor out, Tensor latent_cache, const AttentionMeta& m) {
  const int64_t width = out.size(-1);
  const bool fp8 = latent_cache.dtype == DType::U8;
  const int64_t bytes = latent_cache.size(-1);
  const int64_t rope = fp8 ? mla_fp8_rope_dim(bytes, width) : 0;
  if (fp8)
    OSPREY_CHECK(rope >= 0, "FP8 latent cache row of ", bytes, " bytes cannot hold ", width,
                 " values");
  else
    OSPREY_CHECK(bytes == width, "gather width ", width, " != cache width ", bytes);
  const int32_t* seq_lens = m.seq_lens.ptr<int32_t>();
  int64_t row = 0;
  for (int s = 0; s < m.n_seqs; ++s)
    for (int64_t j = 0; j < seq_lens[s]; ++j, ++row) {
      OSPREY_CHECK(row < out.size(0), "gather output too small");
      const int64_t r = cache_row(m, s, j);
      if (fp8)
        fp8_dequantize_row(out.f32() + row * width, latent_cache.ptr<uint8_t>() + r * bytes,
                           width - rope, rope);
      else
        std::copy_n(latent_cache.f32() + r * width, width, out.f32() + row * width);
    }
  OSPREY_CHECK(row == out.size(0), "gather output rows ", out.size(0), " != ", row);
}

void mla_attention_absorbed(Tensor out, Tensor q, Tensor latent_cache, const AttentionMeta& m,
                            Tensor topk_indices, float scale, Tensor lse) {
  const int64_t H = q.size(1), width = q.size(2), kv_lora = out.size(2);
  const bool fp8 = latent_cache.dtype == DType::U8;
  if (fp8)
    check_fp8_cache(latent_cache, kv_lora, width - kv_lora);
  else
    OSPREY_CHECK(latent_cache.size(-1) == width, "absorbed MLA cache width");
  OSPREY_CHECK(out.size(0) == m.n_tokens && out.size(1) == H, "absorbed MLA shapes");
  OSPREY_CHECK(lse.data == nullptr || (lse.dtype == DType::F32 && lse.numel() == m.n_tokens * H),
               "absorbed MLA lse must be F32 [n_tokens, H]");
  const int64_t bytes = latent_cache.size(-1);
  const int32_t* pos = m.positions.ptr<int32_t>();
  std::vector<int64_t> js;
  std::vector<float> p;
  std::vector<float> rows;    // [attended, width] the token's cache rows (FP8: dequantized)
  std::vector<float> scores;  // [H, attended] q·k, then the attention weights
  std::vector<int64_t> all;   // 0 .. attended - 1
  for (int64_t t = 0; t < m.n_tokens; ++t) {
    const int s = seq_of(m, t);
    attended(js, topk_indices, t, pos[t]);
    OSPREY_CHECK(!js.empty(), "token ", t, " attends to nothing");
    all.resize(js.size());
    std::iota(all.begin(), all.end(), int64_t(0));
    // The attended rows, contiguous (FP8: dequantized): [n_att, width].
    const int64_t n_att = int64_t(js.size());
    rows.resize(size_t(n_att * width));
    for (int64_t i = 0; i < n_att; ++i) {
      const int64_t r = cache_row(m, s, js[size_t(i)]);
      if (fp8)
        fp8_dequantize_row(rows.data() + i * width, latent_cache.ptr<uint8_t>() + r * bytes,
                           kv_lora, width - kv_lora);
      else
        std::copy_n(latent_cache.f32() + r * width, width, rows.data() + i * width);
    }
    // scores [H, n_att] = q[t] · rows^T; softmax per head; out[t] = probs · rows[:, :kv_lora].
    scores.resize(size_t(H * n_att));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(H), int(n_att), int(width), 1.0f,
                q.f32() + t * H * width, int(width), rows.data(), int(width), 0.0f, scores.data(),
                int(n_att));
    for (int64_t h = 0; h < H; ++h) {
      const float l = softmax_attended(scores.data() + h * n_att, n_att, all, scale, p);
      if (lse.data) lse.f32()[t * H + h] = l;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(H), int(kv_lora), int(n_att), 1.0f,
                scores.data(), int(n_att), rows.data(), int(width), 0.0f,
                out.f32() + t * H * kv_lora, int(kv_lora));
  }
}

void mla_attention_expanded(Tensor out, Tensor q, Tensor k, Tensor v, const AttentionMeta& m,
                            Tensor topk_indices, float scale) {
  const int64_t H = q.size(1), qk = q.size(2), vd = v.size(2);
  OSPREY_CHECK(k.size(1) == H && k.size(2) == qk && v.size(1) == H && out.size(2) == vd,
               "expanded MLA shapes");
  const int32_t* pos = m.positions.ptr<int32_t>();
  const int32_t* seq_lens = m.seq_lens.ptr<int32_t>();
  std::vector<int64_t> kv_start(size_t(m.n_seqs) + 1, 0);
  for (int s = 0; s < m.n_seqs; ++s) kv_start[size_t(s) + 1] = kv_start[size_t(s)] + seq_lens[s];
  OSPREY_CHECK(kv_start.back() == k.size(0), "K rows ", k.size(0), " != sum of seq_lens");
  const int32_t* qsl = m.query_start_loc.ptr<int32_t>();
  std::vector<int64_t> js;
  std::vector<float> p;
  std::vector<float> scores;  // [n, P] a block of tokens' q·k for one head, then the weights
  for (int s = 0; s < m.n_seqs; ++s) {
    const int64_t t_begin = qsl[s];
    const int64_t t_end = s + 1 < m.n_seqs ? std::min<int64_t>(qsl[s + 1], m.n_tokens) : m.n_tokens;
    const float* ks = k.f32() + kv_start[size_t(s)] * H * qk;  // the sequence's rows
    const float* vs = v.f32() + kv_start[size_t(s)] * H * vd;
    for (int64_t t0 = t_begin; t0 < t_end; t0 += kMlaTokenBlock) {
      const int64_t t1 = std::min(t_end, t0 + kMlaTokenBlock), n = t1 - t0;
      int64_t P = 0;
      for (int64_t t = t0; t < t1; ++t) P = std::max<int64_t>(P, pos[t] + 1);
      OSPREY_CHECK(P <= seq_lens[s], "position ", P - 1, " beyond sequence ", s, "'s K rows");
      scores.resize(size_t(n * P));
      for (int64_t h = 0; h < H; ++h) {
        // scores = q[t0:t1, h] · k[0:P, h]^T; per token the softmax over what it attends (zero
        // elsewhere); out[t0:t1, h] = scores · v[0:P, h].
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(P), int(qk), 1.0f,
                    q.f32() + (t0 * H + h) * qk, int(H * qk), ks + h * qk, int(H * qk), 0.0f,
                    scores.data(), int(P));
        for (int64_t t = t0; t < t1; ++t) {
          attended(js, topk_indices, t, pos[t]);
          OSPREY_CHECK(!js.empty(), "token ", t, " attends to nothing");
          softmax_attended(scores.data() + (t - t0) * P, P, js, scale, p);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(vd), int(P), 1.0f,
                    scores.data(), int(P), vs + h * vd, int(H * vd), 0.0f,
                    out.f32() + (t0 * H + h) * vd, int(H * vd));
      }
    }
  }
}

}  // namespace osprey::ops::cpu
