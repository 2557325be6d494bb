// CPU MLA: plain loops over (token, head, context position), softmax in F32 with the max
// subtracted, accumulation in F32. The FP8 (U8) latent cache format of ops/mla.h is written and
// read with plain loops: the reference for the CUDA twin. Reads dequantize the rows first, then
// run the same arithmetic as for an F32 cache holding the dequantized values.
#include "ops/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace osprey::ops::cpu {

namespace {

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

// softmax(scores) in place; returns nothing (scores become probabilities).
void softmax(std::vector<float>& x) {
  float mx = -std::numeric_limits<float>::infinity();
  for (float v : x) mx = std::max(mx, v);
  double sum = 0.0;
  for (float& v : x) {
    v = std::exp(v - mx);
    sum += v;
  }
  for (float& v : x) v = float(v / sum);
}

// One head over its attended rows: out[0, vd) = Σ_i softmax(scale · q·keys[i])_i · values[i][0,
// vd). (Absorbed MLA passes the same cache rows as keys (576 wide) and values (their first 512).)
// Returns log Σ_i e^score_i (natural log) of the head's scaled scores.
float attend_head(float* out, const float* q, const std::vector<const float*>& keys, int64_t qk,
                  const std::vector<const float*>& values, int64_t vd, float scale,
                  std::vector<float>& p) {
  p.assign(keys.size(), 0.0f);
  for (size_t i = 0; i < keys.size(); ++i) {
    float dot = 0.0f;
    for (int64_t d = 0; d < qk; ++d) dot += q[d] * keys[i][d];
    p[i] = dot * scale;
  }
  const float mx = *std::max_element(p.begin(), p.end());
  double sum = 0.0;
  for (float v : p) sum += std::exp(double(v) - mx);
  const float lse = mx + float(std::log(sum));
  softmax(p);
  std::fill_n(out, vd, 0.0f);
  for (size_t i = 0; i < keys.size(); ++i)
    for (int64_t d = 0; d < vd; ++d) out[d] += p[i] * values[i][d];
  return lse;
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
  std::vector<float> deq;  // FP8: [attended, width] the token's rows, dequantized
  for (int64_t t = 0; t < m.n_tokens; ++t) {
    const int s = seq_of(m, t);
    attended(js, topk_indices, t, pos[t]);
    OSPREY_CHECK(!js.empty(), "token ", t, " attends to nothing");
    std::vector<const float*> rows(js.size());
    if (fp8) deq.resize(js.size() * size_t(width));
    for (size_t i = 0; i < js.size(); ++i) {
      const int64_t r = cache_row(m, s, js[i]);
      if (fp8) {
        float* d = deq.data() + i * size_t(width);
        fp8_dequantize_row(d, latent_cache.ptr<uint8_t>() + r * bytes, kv_lora, width - kv_lora);
        rows[i] = d;
      } else {
        rows[i] = latent_cache.f32() + r * width;
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      const float l = attend_head(out.f32() + (t * H + h) * kv_lora, q.f32() + (t * H + h) * width,
                                  rows, width, rows, kv_lora, scale, p);
      if (lse.data) lse.f32()[t * H + h] = l;
    }
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
  std::vector<int64_t> js;
  std::vector<float> p;
  std::vector<const float*> keys, values;
  for (int64_t t = 0; t < m.n_tokens; ++t) {
    const int s = seq_of(m, t);
    attended(js, topk_indices, t, pos[t]);
    OSPREY_CHECK(!js.empty(), "token ", t, " attends to nothing");
    keys.resize(js.size());
    values.resize(js.size());
    for (int64_t h = 0; h < H; ++h) {
      for (size_t i = 0; i < js.size(); ++i) {
        keys[i] = k.f32() + ((kv_start[size_t(s)] + js[i]) * H + h) * qk;
        values[i] = v.f32() + ((kv_start[size_t(s)] + js[i]) * H + h) * vd;
      }
      attend_head(out.f32() + (t * H + h) * vd, q.f32() + (t * H + h) * qk, keys, qk, values, vd,
                  scale, p);
    }
  }
}

}  // namespace osprey::ops::cpu
