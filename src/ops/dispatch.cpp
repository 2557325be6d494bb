// Backend dispatch: each ops:: entry runs the twin for the device of its output tensor (the CPU
// twins in ops/cpu/, the CUDA twins in ops/cuda/ when built with OSPREY_WITH_CUDA).
// The forward pass is written once against these entries.
#include <algorithm>

#include "core/error.h"
#include "ops/activation.h"
#include "ops/embedding.h"
#include "ops/gemm.h"
#include "ops/indexer.h"
#include "ops/mla.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/sample.h"
#include "ops/tensor_ops.h"

#ifdef OSPREY_WITH_CUDA
#include "core/device_buffer.h"
#endif

namespace osprey::ops {

#ifndef OSPREY_WITH_CUDA
namespace {
[[noreturn]] void no_cuda(const char* op) {
  fail("op ", op, " was given CUDA tensors, but this build has no CUDA backend");
}
}  // namespace
#endif

#ifdef OSPREY_WITH_CUDA
#define OSPREY_DISPATCH(op, dev, ...)                      \
  do {                                                     \
    if ((dev) == Device::CPU) return cpu::op(__VA_ARGS__); \
    return cuda::op(__VA_ARGS__);                          \
  } while (0)
#else
#define OSPREY_DISPATCH(op, dev, ...)                      \
  do {                                                     \
    if ((dev) == Device::CPU) return cpu::op(__VA_ARGS__); \
    no_cuda(#op);                                          \
  } while (0)
#endif

void linear(Tensor y, Tensor x, const LinearWeight& w) {
  OSPREY_DISPATCH(linear, y.device, y, x, w);
}
void linears(Tensor x, std::initializer_list<LinearOut> outs) {
  if (outs.size() == 0) return;
  const std::span<const LinearOut> s(outs.begin(), outs.size());
  OSPREY_DISPATCH(linears, s[0].y.device, x, s);
}
void linears(Tensor x, const Fp8Act& xq, std::initializer_list<LinearOut> outs, Tensor x_bf16) {
  if (outs.size() == 0) return;
  const std::span<const LinearOut> s(outs.begin(), outs.size());
  if (s[0].y.device == Device::CPU) return cpu::linears(x, s);  // they quantise x themselves
#ifdef OSPREY_WITH_CUDA
  cuda::linears(x, xq, x_bf16, s);
#else
  (void)xq, (void)x_bf16;
  no_cuda("linears");
#endif
}
Fp8ActShape fp8_act_shape(Device device, int64_t n, int64_t in) {
#ifdef OSPREY_WITH_CUDA
  if (device == Device::CUDA) return cuda::fp8_act_shape(n, in);
#endif
  (void)device, (void)n, (void)in;
  return {};
}
void dequantize(Tensor out, const LinearWeight& w) {
  OSPREY_DISPATCH(dequantize, out.device, out, w);
}
void rms_norm(Tensor out, Tensor x, Tensor w, float eps) {
  OSPREY_DISPATCH(rms_norm, out.device, out, x, w, eps);
}
void add_rms_norm(Tensor out, Tensor residual, Tensor x, Tensor w, float eps) {
  OSPREY_DISPATCH(add_rms_norm, out.device, out, residual, x, w, eps);
}
void rms_norm_multi(const NormOutputs& o, Tensor x, Tensor w, float eps) {
  OSPREY_DISPATCH(rms_norm_multi, o.out.device, o, x, w, eps);
}
void add_rms_norm_multi(const NormOutputs& o, Tensor residual, Tensor x, Tensor w, float eps) {
  OSPREY_DISPATCH(add_rms_norm_multi, o.out.device, o, residual, x, w, eps);
}
void layer_norm(Tensor out, Tensor x, Tensor w, Tensor b, float eps) {
  OSPREY_DISPATCH(layer_norm, out.device, out, x, w, b, eps);
}
void rope(Tensor x, int offset, int rope_dim, Tensor positions, Tensor inv_freq,
          float attention_factor, bool interleaved) {
  OSPREY_DISPATCH(rope, x.device, x, offset, rope_dim, positions, inv_freq, attention_factor,
                  interleaved);
}
void mla_absorb_q(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v) {
  OSPREY_DISPATCH(mla_absorb_q, q_abs.device, q_abs, q, kv_b, nope, v);
}
void mla_absorb_q_rope(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v, Tensor positions,
                       Tensor inv_freq, float attention_factor, bool interleaved) {
  OSPREY_DISPATCH(mla_absorb_q_rope, q_abs.device, q_abs, q, kv_b, nope, v, positions, inv_freq,
                  attention_factor, interleaved);
}
void mla_unabsorb_out(Tensor out, Tensor o_lat, Tensor kv_b, int nope) {
  OSPREY_DISPATCH(mla_unabsorb_out, out.device, out, o_lat, kv_b, nope);
}
void mla_cache_write(Tensor latent_cache, Tensor latent, Tensor k_pe, const AttentionMeta& m) {
  OSPREY_DISPATCH(mla_cache_write, latent_cache.device, latent_cache, latent, k_pe, m);
}
void mla_kv_write(Tensor latent_cache, Tensor kv, Tensor norm_w, float eps, Tensor inv_freq,
                  float attention_factor, bool interleaved, const AttentionMeta& m) {
  OSPREY_DISPATCH(mla_kv_write, latent_cache.device, latent_cache, kv, norm_w, eps, inv_freq,
                  attention_factor, interleaved, m);
}
void mla_cache_gather(Tensor out, Tensor latent_cache, const AttentionMeta& m) {
  OSPREY_DISPATCH(mla_cache_gather, out.device, out, latent_cache, m);
}
void mla_attention_absorbed(Tensor out, Tensor q, Tensor latent_cache, const AttentionMeta& m,
                            Tensor topk_indices, float scale, Tensor lse) {
  OSPREY_DISPATCH(mla_attention_absorbed, out.device, out, q, latent_cache, m, topk_indices, scale,
                  lse);
}
bool mla_absorbed_prefill_preferred(Device device, int64_t heads, int64_t kv_lora, int64_t rope,
                                    bool sparse) {
#ifdef OSPREY_WITH_CUDA
  if (device == Device::CUDA)
    return cuda::mla_absorbed_prefill_preferred(heads, kv_lora, rope, sparse);
#endif
  (void)device, (void)heads, (void)kv_lora, (void)rope, (void)sparse;
  return false;
}
void mla_attention_expanded(Tensor out, Tensor q, Tensor k, Tensor v, const AttentionMeta& m,
                            Tensor topk_indices, float scale) {
  OSPREY_DISPATCH(mla_attention_expanded, out.device, out, q, k, v, m, topk_indices, scale);
}
void indexer_cache_write(Tensor index_cache, Tensor k, const AttentionMeta& m) {
  OSPREY_DISPATCH(indexer_cache_write, index_cache.device, index_cache, k, m);
}
void indexer_topk(Tensor topk_indices, Tensor q, Tensor weights, Tensor index_cache,
                  const AttentionMeta& m, float scale) {
  OSPREY_DISPATCH(indexer_topk, topk_indices.device, topk_indices, q, weights, index_cache, m,
                  scale);
}
void indexer_quantize_q(Tensor q8, Tensor weights_out, Tensor q, Tensor weights) {
  OSPREY_DISPATCH(indexer_quantize_q, q8.device, q8, weights_out, q, weights);
}
void indexer_k_write(Tensor index_cache, Tensor k_raw, Tensor norm_w, Tensor norm_b, float eps,
                     int rope_dim, Tensor inv_freq, float attention_factor,
                     const AttentionMeta& m) {
  OSPREY_DISPATCH(indexer_k_write, index_cache.device, index_cache, k_raw, norm_w, norm_b, eps,
                  rope_dim, inv_freq, attention_factor, m);
}
void indexer_q_prep(Tensor q8, Tensor weights_out, Tensor q, Tensor weights, float weights_scale,
                    int rope_dim, Tensor positions, Tensor inv_freq, float attention_factor) {
  OSPREY_DISPATCH(indexer_q_prep, q8.device, q8, weights_out, q, weights, weights_scale, rope_dim,
                  positions, inv_freq, attention_factor);
}
void moe_route(Tensor topk_ids, Tensor topk_weights, Tensor router_logits, Tensor correction_bias,
               const RouterParams& p) {
  OSPREY_DISPATCH(moe_route, topk_ids.device, topk_ids, topk_weights, router_logits,
                  correction_bias, p);
}
void moe_experts(Tensor out, Tensor x, Tensor topk_ids, Tensor topk_weights,
                 const std::vector<MlpWeights>& experts, Tensor addend) {
  OSPREY_DISPATCH(moe_experts, out.device, out, x, topk_ids, topk_weights, experts, addend);
}
void sample(Tensor tokens, Tensor logprobs, Tensor top_ids, Tensor logits, const SampleMeta& m) {
  OSPREY_DISPATCH(sample, tokens.device, tokens, logprobs, top_ids, logits, m);
}
void silu_mul(Tensor out, Tensor gate, Tensor up) {
  OSPREY_DISPATCH(silu_mul, out.device, out, gate, up);
}
void silu_mul_multi(Tensor out, const Fp8Act& q8, Tensor gate, Tensor up) {
  OSPREY_DISPATCH(silu_mul_multi, out.device, out, q8, gate, up);
}
void embedding(Tensor out, Tensor ids, Tensor table) {
  OSPREY_DISPATCH(embedding, out.device, out, ids, table);
}

void copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col, int64_t width) {
  OSPREY_DISPATCH(copy_columns, dst.device, dst, dst_col, src, src_col, width);
}
// A row gather is the embedding lookup with `src` as the table.
void gather_rows(Tensor out, Tensor src, Tensor indices) {
  embedding(out, indices, src);
}
void add(Tensor out, Tensor a, Tensor b) {
  OSPREY_DISPATCH(add, out.device, out, a, b);
}
void scale(Tensor x, float s) {
  OSPREY_DISPATCH(scale, x.device, x, s);
}
void copy(Tensor dst, Tensor src) {
  OSPREY_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy of ",
               shape_str(src.shape), " into ", shape_str(dst.shape));
  if (dst.device == Device::CPU && src.device == Device::CPU) {
    std::copy_n(static_cast<const char*>(src.data), src.nbytes(), static_cast<char*>(dst.data));
    return;
  }
#ifdef OSPREY_WITH_CUDA
  osprey::cuda::copy(dst, src);
#else
  no_cuda("copy");
#endif
}

}  // namespace osprey::ops
