// The model's weights by role, loaded from a checkpoint under the published Hugging Face names
// (model.layers.N.self_attn.q_a_proj.weight, mlp.experts.J.gate_proj.weight, ...).
// Every expected tensor must exist with the shape config.json implies, in a supported dtype
// (F32, BF16, F16, or F8_E4M3 with its `weight_scale_inv`); failures name the tensor and file.
// The first MTP layer (model.layers.{num_hidden_layers}, config num_nextn_predict_layers ≥ 1) is
// loaded when the checkpoint holds it (model_math.md §2.8); its own copy of the embedding
// (model.layers.N.embed_tokens, equal to the main one) and further MTP layers are skipped.
//
// On the CPU backend every tensor is converted to F32 at load (FP8 dequantized with its block
// scales) and owned here; the checkpoint mapping can be dropped afterwards.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "model/safetensors.h"
#include "ops/gemm.h"
#include "ops/moe.h"

namespace osprey {

struct IndexerWeights {
  LinearWeight wq_b;          // [IH·ID, q_lora]
  LinearWeight wk;            // [ID, D]
  Tensor k_norm_weight;       // [ID]
  Tensor k_norm_bias;         // [ID]
  LinearWeight weights_proj;  // [IH, D]
};

struct AttentionWeights {
  LinearWeight q_proj;     // [H·(nope+rope), D]   (no q LoRA)
  LinearWeight q_a_proj;   // [q_lora, D]
  Tensor q_a_norm;         // [q_lora]
  LinearWeight q_b_proj;   // [H·(nope+rope), q_lora]
  LinearWeight kv_a_proj;  // [kv_lora + rope, D]
  Tensor kv_a_norm;        // [kv_lora]
  LinearWeight kv_b_proj;  // [H·(nope+v), kv_lora]: per head nope rows then v rows
  LinearWeight o_proj;     // [D, H·v]
  IndexerWeights indexer;  // V3.2 only
};

struct LayerWeights {
  Tensor input_norm;      // [D]
  Tensor post_attn_norm;  // [D]
  AttentionWeights attn;
  bool moe = false;
  MlpWeights mlp;                   // dense layers
  Tensor router;                    // [E, D]
  Tensor correction_bias;           // [E] (noaux_tc only)
  std::vector<MlpWeights> experts;  // experts first_expert.. (all of them unless sharded)
  bool has_shared = false;
  MlpWeights shared;  // [n_shared·moe_I, D] ...
};

// DeepSeek's multi-token-prediction layer around its decoder layer (which is
// ModelWeights::layers[num_hidden_layers]): h' = eh_proj(cat[enorm(emb(token)), hnorm(h)]), the
// decoder layer, then shared_head.norm and shared_head.head.
struct MtpWeights {
  Tensor enorm;          // [D]
  Tensor hnorm;          // [D]
  LinearWeight eh_proj;  // [D, 2·D]: columns [0, D) take the embedding, [D, 2·D) the hidden
  Tensor head_norm;      // [D] shared_head.norm
  LinearWeight head;     // [V, D] shared_head.head
};

struct ModelWeights {
  Tensor embed;                      // [V, D]
  Tensor final_norm;                 // [D]
  LinearWeight lm_head;              // [V, D]
  std::vector<LayerWeights> layers;  // num_hidden_layers, then the MTP decoder layer (has_mtp)
  bool has_mtp = false;
  MtpWeights mtp;
  std::vector<Buffer> owned;          // storage behind the views above (CPU loader)
  std::vector<Storage> device_owned;  // storage behind the views above (device loaders)
  int skipped_mtp_tensors = 0;
  int first_expert = 0;  // global id of layers[l].experts[0]
};

// Loads every weight of `config` from `ckpt` as F32 host tensors.
ModelWeights load_weights_cpu(const Checkpoint& ckpt, const ModelConfig& config);

// Loads every weight onto the GPU in the form its CUDA op reads:
//   linear weights stored F8_E4M3 in the checkpoint: the e4m3 bytes + F32 weight_scale_inv as is;
//   other linear weights (BF16/F16/F32 in the checkpoint), the embedding, lm_head and the MoE
//   router (gate): BF16 (DeepSeek's checkpoints store the gate in BF16, so nothing is lost; its
//   GEMM writes BF16 logits that the fused routing kernel reads, model/moe_router.h; F32 with
//   OSPREY_ROUTER_BF16=0, for before/after accuracy figures);
//   norms, norm biases and the router's correction bias: F32 (small; the bias is added to the
//   sigmoid scores in F32).
ModelWeights load_weights_cuda(const Checkpoint& ckpt, const ModelConfig& config);
// The same layout with random values made on the GPU from `seed` (`--load-format dummy`): FP8
// linear weights (e4m3 uniform in ±1, block scales sqrt(3 / in) so activations keep unit scale)
// where weight_specs says fp8 and `fp8` is set, else BF16 uniform in ±sqrt(3 / in); norm weights
// uniform in [0.9, 1.1); never zeros.
ModelWeights make_dummy_weights_cuda(const ModelConfig& config, uint64_t seed, bool fp8);

// Builds ModelWeights from every tensor weight_specs names (non-linear ones with empty scales).
void assemble_weights(const ModelConfig& config, const std::map<std::string, LinearWeight>& tensors,
                      ModelWeights& out);

// Every tensor a config implies, under its published name: what the loader requires and what
// make-model writes. fp8 marks the linear weights that FP8 checkpoints store as e4m3 + scales.
enum class WeightKind { Embedding, Norm, NormBias, Linear, Router, CorrectionBias };
// Rows (dim 0) or columns (dim 1) [begin, end) of a checkpoint tensor: the part one rank of a
// parallel model reads (model/shard.h). dim −1: the whole tensor.
struct TensorSlice {
  int dim = -1;
  int64_t begin = 0, end = 0;
};
struct WeightSpec {
  std::string name;
  Shape shape;  // in the checkpoint
  WeightKind kind;
  bool fp8 = false;
  TensorSlice slice;
  Shape local_shape() const;  // the shape after the slice
};
// weight_specs = main_weight_specs + mtp_weight_specs (empty when num_nextn_predict_layers is 0).
std::vector<WeightSpec> weight_specs(const ModelConfig& config);
std::vector<WeightSpec> main_weight_specs(const ModelConfig& config);
std::vector<WeightSpec> mtp_weight_specs(const ModelConfig& config);
// "model.layers.{num_hidden_layers}.": the MTP layer's tensor prefix.
std::string mtp_prefix(const ModelConfig& config);
// weight_specs, less the MTP layer when `ckpt` does not hold it (checkpoints published without
// it although config.json declares it; a note goes to stderr).
std::vector<WeightSpec> weight_specs_for(const Checkpoint& ckpt, const ModelConfig& config);

// The loaders over an explicit list of specs (a rank's shard_weight_specs); weights of experts
// the list leaves out are absent from the result (ModelWeights::first_expert says which are held).
// Tensors are read in checkpoint order (file, then offset) and a progress line goes to stderr
// (safetensors shards done, GB read, GB/s) prefixed by `label`.
ModelWeights load_weights_cpu(const Checkpoint& ckpt, const ModelConfig& config,
                              const std::vector<WeightSpec>& specs, const std::string& label);
ModelWeights load_weights_cuda(const Checkpoint& ckpt, const ModelConfig& config,
                               const std::vector<WeightSpec>& specs, const std::string& label);
ModelWeights make_dummy_weights_cuda(const ModelConfig& config, uint64_t seed, bool fp8,
                                     const std::vector<WeightSpec>& specs);

}  // namespace osprey
