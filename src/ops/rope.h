// Rotary position embedding, in place, on the slice [offset, offset + rope_dim) of every head.
//   angle_i(p) = p · inv_freq[i] (F32 product, as transformers computes it), i < rope_dim/2;
//   c = cos(angle)·attention_factor, s = sin(angle)·attention_factor.
// Interleaved (MLA, DeepSeek's complex pairs): pairs (x[2i], x[2i+1]) rotate by angle_i.
// Half-split (the V3.2 indexer, rotate_half): pairs (x[i], x[i + rope_dim/2]) rotate by angle_i.
// Interleaved output keeps DeepSeek's pair layout (transformers leaves it de-interleaved; dot
// products between q and k are the same either way).
//
// x: [n_tokens, n_heads, head_dim] F32; positions: [n_tokens] I32; inv_freq: [rope_dim/2] F32.
#pragma once

#include <vector>

#include "config/model_config.h"
#include "core/tensor.h"

namespace osprey {

// inv_freq of the config's rope (YaRN-corrected when rope_scaling is yarn), over qk_rope_head_dim.
std::vector<float> rope_inv_freq(const ModelConfig& c);

namespace ops {
void rope(Tensor x, int offset, int rope_dim, Tensor positions, Tensor inv_freq,
          float attention_factor, bool interleaved);
namespace cpu {
void rope(Tensor x, int offset, int rope_dim, Tensor positions, Tensor inv_freq,
          float attention_factor, bool interleaved);
}
// The CUDA twins (ops/cuda/), built with OSPREY_WITH_CUDA; dtypes in each .cu file's header.
namespace cuda {
void rope(Tensor x, int offset, int rope_dim, Tensor positions, Tensor inv_freq,
          float attention_factor, bool interleaved);
}  // namespace cuda
}  // namespace ops
}  // namespace osprey
