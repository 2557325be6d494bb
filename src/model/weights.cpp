#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "model/weight_slice.h"

namespace osprey {

namespace {

// The specs of one decoder layer (attention, FFN and their norms) under the prefix `L`
// ("model.layers.N."); `moe` picks the routed-experts FFN.
void decoder_layer_specs(const ModelConfig& c, const std::string& L, bool moe,
                         std::vector<WeightSpec>& w) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  auto lin = [&](const std::string& n, int64_t out, int64_t in, bool fp8 = true) {
    w.push_back({n, {out, in}, WeightKind::Linear, fp8, {}});
  };
  auto norm = [&](const std::string& n, int64_t d) {
    w.push_back({n, {d}, WeightKind::Norm, false, {}});
  };
  auto mlp = [&](const std::string& p, int64_t inter) {
    lin(p + "gate_proj.weight", inter, D);
    lin(p + "up_proj.weight", inter, D);
    lin(p + "down_proj.weight", D, inter);
  };
  const std::string A = L + "self_attn.";
  norm(L + "input_layernorm.weight", D);
  norm(L + "post_attention_layernorm.weight", D);
  if (c.q_lora_rank) {
    lin(A + "q_a_proj.weight", c.q_lora_rank, D);
    norm(A + "q_a_layernorm.weight", c.q_lora_rank);
    lin(A + "q_b_proj.weight", H * c.qk_head_dim(), c.q_lora_rank);
  } else {
    lin(A + "q_proj.weight", H * c.qk_head_dim(), D);
  }
  lin(A + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, D);
  norm(A + "kv_a_layernorm.weight", c.kv_lora_rank);
  lin(A + "kv_b_proj.weight", H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
  lin(A + "o_proj.weight", D, H * c.v_head_dim);
  if (c.has_indexer) {
    const std::string I = A + "indexer.";
    lin(I + "wq_b.weight", int64_t(c.index_n_heads) * c.index_head_dim, c.q_lora_rank);
    lin(I + "wk.weight", c.index_head_dim, D);
    norm(I + "k_norm.weight", c.index_head_dim);
    w.push_back({I + "k_norm.bias", {c.index_head_dim}, WeightKind::NormBias, false, {}});
    lin(I + "weights_proj.weight", c.index_n_heads, D, /*fp8=*/false);
  }
  if (moe) {
    w.push_back({L + "mlp.gate.weight", {c.n_routed_experts, D}, WeightKind::Router, false, {}});
    if (c.topk_method == TopkMethod::NoauxTc)
      w.push_back({L + "mlp.gate.e_score_correction_bias",
                   {c.n_routed_experts},
                   WeightKind::CorrectionBias,
                   false,
                   {}});
    for (int e = 0; e < c.n_routed_experts; ++e)
      mlp(L + "mlp.experts." + std::to_string(e) + ".", c.moe_intermediate_size);
    if (c.n_shared_experts > 0)
      mlp(L + "mlp.shared_experts.", int64_t(c.n_shared_experts) * c.moe_intermediate_size);
  } else {
    mlp(L + "mlp.", c.intermediate_size);
  }
}

std::string layer_prefix(int i) {
  return "model.layers." + std::to_string(i) + ".";
}

}  // namespace

std::string mtp_prefix(const ModelConfig& c) {
  return layer_prefix(c.num_hidden_layers);
}

std::vector<WeightSpec> main_weight_specs(const ModelConfig& c) {
  std::vector<WeightSpec> w;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  w.push_back({"model.embed_tokens.weight", {V, D}, WeightKind::Embedding, false, {}});
  for (int i = 0; i < c.num_hidden_layers; ++i)
    decoder_layer_specs(c, layer_prefix(i), c.is_moe_layer(i), w);
  w.push_back({"model.norm.weight", {D}, WeightKind::Norm, false, {}});
  if (!c.tie_word_embeddings)
    w.push_back({"lm_head.weight", {V, D}, WeightKind::Linear, false, {}});
  return w;
}

std::vector<WeightSpec> mtp_weight_specs(const ModelConfig& c) {
  std::vector<WeightSpec> w;
  if (c.num_nextn_predict_layers <= 0) return w;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  const std::string M = mtp_prefix(c);
  w.push_back({M + "enorm.weight", {D}, WeightKind::Norm, false, {}});
  w.push_back({M + "hnorm.weight", {D}, WeightKind::Norm, false, {}});
  // Published checkpoints keep eh_proj unquantized (BF16) even in FP8 releases.
  w.push_back({M + "eh_proj.weight", {D, 2 * D}, WeightKind::Linear, false, {}});
  decoder_layer_specs(c, M, c.is_moe_layer(c.num_hidden_layers), w);
  w.push_back({M + "shared_head.norm.weight", {D}, WeightKind::Norm, false, {}});
  w.push_back({M + "shared_head.head.weight", {V, D}, WeightKind::Linear, false, {}});
  return w;
}

std::vector<WeightSpec> weight_specs(const ModelConfig& c) {
  std::vector<WeightSpec> w = main_weight_specs(c);
  const std::vector<WeightSpec> m = mtp_weight_specs(c);
  w.insert(w.end(), m.begin(), m.end());
  return w;
}

std::vector<WeightSpec> weight_specs_for(const Checkpoint& ckpt, const ModelConfig& c) {
  const std::vector<WeightSpec> m = mtp_weight_specs(c);
  if (m.empty() || ckpt.contains(mtp_prefix(c) + "eh_proj.weight")) return weight_specs(c);
  std::fprintf(
      stderr,
      "osprey: note: config.json declares %d MTP layer(s) but %s holds no %seh_proj.weight:"
      " loading the model without its MTP layer (no --speculative-config mtp)\n",
      c.num_nextn_predict_layers, ckpt.path().c_str(), mtp_prefix(c).c_str());
  return main_weight_specs(c);
}

namespace {

// Converts one checkpoint tensor (its slice, and its scales) to an owned F32 buffer.
class Loader {
 public:
  Loader(const Checkpoint& ck, ModelWeights& mw) : ck_(ck), mw_(mw) {}

  Tensor load(const WeightSpec& spec, LoadProgress& progress) {
    std::vector<Buffer> scratch;
    const WeightRead r = read_weight(ck_, spec, scratch);
    const Tensor t = r.value;
    const Shape local = spec.local_shape();
    Buffer out(DType::F32, local);
    const std::string& file = ck_.file_of(spec.name);
    switch (t.dtype) {
      case DType::F32:
        std::memcpy(out.f32(), t.data, t.nbytes());
        break;
      case DType::BF16:
      case DType::F16: {
        LinearWeight lw{t.reshape({t.numel() / t.shape.back(), t.shape.back()}), {}};
        ops::cpu::dequantize(out.view().reshape(lw.weight.shape), lw);
        break;
      }
      case DType::F8_E4M3: {
        const std::string sname = spec.name + "_scale_inv";
        const Tensor& sc = r.scale_inv;
        for (int64_t i = 0; i < sc.numel(); ++i)
          if (!(std::isfinite(sc.f32()[i]) && sc.f32()[i] > 0))
            fail(ck_.file_of(sname), ": tensor '", sname,
                 "' holds a non-positive or non-finite scale");
        used_.insert(sname);
        ops::cpu::dequantize(out, LinearWeight{t, sc});
        break;
      }
      default:
        fail(file, ": tensor '", spec.name, "' has dtype ", dtype_name(t.dtype),
             "; expected F32, BF16, F16 or F8_E4M3");
    }
    if (ck_.contains(spec.name + "_scale_inv")) used_.insert(spec.name + "_scale_inv");
    used_.insert(spec.name);
    progress.add(int(ck_.file_index(spec.name)), r.bytes);
    Tensor v = out.view();
    mw_.owned.push_back(std::move(out));
    return v;
  }

  const std::set<std::string>& used() const { return used_; }

 private:
  const Checkpoint& ck_;
  ModelWeights& mw_;
  std::set<std::string> used_;
};

}  // namespace

namespace {

LayerWeights assemble_layer(const ModelConfig& c, const std::map<std::string, LinearWeight>& t,
                            const std::string& L, bool moe, ModelWeights& mw) {
  auto lin = [&](const std::string& n) { return t.at(n); };
  auto ten = [&](const std::string& n) { return t.at(n).weight; };
  auto mlp = [&](const std::string& p) {
    return MlpWeights{lin(p + "gate_proj.weight"), lin(p + "up_proj.weight"),
                      lin(p + "down_proj.weight")};
  };
  const std::string A = L + "self_attn.";
  LayerWeights lw;
  lw.input_norm = ten(L + "input_layernorm.weight");
  lw.post_attn_norm = ten(L + "post_attention_layernorm.weight");
  if (c.q_lora_rank) {
    lw.attn.q_a_proj = lin(A + "q_a_proj.weight");
    lw.attn.q_a_norm = ten(A + "q_a_layernorm.weight");
    lw.attn.q_b_proj = lin(A + "q_b_proj.weight");
  } else {
    lw.attn.q_proj = lin(A + "q_proj.weight");
  }
  lw.attn.kv_a_proj = lin(A + "kv_a_proj_with_mqa.weight");
  lw.attn.kv_a_norm = ten(A + "kv_a_layernorm.weight");
  lw.attn.kv_b_proj = lin(A + "kv_b_proj.weight");
  lw.attn.o_proj = lin(A + "o_proj.weight");
  if (c.has_indexer) {
    const std::string I = A + "indexer.";
    lw.attn.indexer = {lin(I + "wq_b.weight"), lin(I + "wk.weight"), ten(I + "k_norm.weight"),
                       ten(I + "k_norm.bias"), lin(I + "weights_proj.weight")};
  }
  lw.moe = moe;
  if (lw.moe) {
    lw.router = ten(L + "mlp.gate.weight");
    if (c.topk_method == TopkMethod::NoauxTc)
      lw.correction_bias = ten(L + "mlp.gate.e_score_correction_bias");
    // The experts the tensors hold (all, or one rank's contiguous range).
    for (int e = 0; e < c.n_routed_experts; ++e) {
      const std::string p = L + "mlp.experts." + std::to_string(e) + ".";
      if (!t.count(p + "gate_proj.weight")) continue;
      if (mw.first_expert < 0) mw.first_expert = e;
      OSPREY_CHECK(e == mw.first_expert + int(lw.experts.size()), "experts not contiguous");
      lw.experts.push_back(mlp(p));
    }
    lw.has_shared = c.n_shared_experts > 0;
    if (lw.has_shared) lw.shared = mlp(L + "mlp.shared_experts.");
  } else {
    lw.mlp = mlp(L + "mlp.");
  }
  return lw;
}

}  // namespace

void assemble_weights(const ModelConfig& c, const std::map<std::string, LinearWeight>& t,
                      ModelWeights& mw) {
  auto lin = [&](const std::string& n) { return t.at(n); };
  auto ten = [&](const std::string& n) { return t.at(n).weight; };
  mw.embed = ten("model.embed_tokens.weight");
  mw.final_norm = ten("model.norm.weight");
  mw.lm_head = c.tie_word_embeddings ? LinearWeight{mw.embed, {}} : lin("lm_head.weight");
  mw.first_expert = -1;
  for (int i = 0; i < c.num_hidden_layers; ++i)
    mw.layers.push_back(assemble_layer(c, t, layer_prefix(i), c.is_moe_layer(i), mw));
  // The MTP layer (model.layers.{num_hidden_layers}), when the tensors hold it: its decoder layer
  // goes to layers[num_hidden_layers], the rest to mw.mtp.
  const std::string M = mtp_prefix(c);
  mw.has_mtp = c.num_nextn_predict_layers > 0 && t.count(M + "eh_proj.weight");
  if (mw.has_mtp) {
    mw.mtp.enorm = ten(M + "enorm.weight");
    mw.mtp.hnorm = ten(M + "hnorm.weight");
    mw.mtp.eh_proj = lin(M + "eh_proj.weight");
    mw.mtp.head_norm = ten(M + "shared_head.norm.weight");
    mw.mtp.head = lin(M + "shared_head.head.weight");
    mw.layers.push_back(assemble_layer(c, t, M, c.is_moe_layer(c.num_hidden_layers), mw));
  }
  if (mw.first_expert < 0) mw.first_expert = 0;
}

static void report_unused(const Checkpoint& ckpt, const ModelConfig& c,
                          const std::set<std::string>& used, ModelWeights& mw, bool sharded) {
  // Tensors nobody asked for: the MTP layers are expected (skipped); anything else is reported.
  int unknown = 0;
  std::string first_unknown;
  for (const std::string& name : ckpt.names()) {
    if (used.count(name)) continue;
    // A sharded load leaves out other ranks' experts on purpose.
    if (sharded && name.find(".mlp.experts.") != std::string::npos) continue;
    int layer = -1;
    if (std::sscanf(name.c_str(), "model.layers.%d.", &layer) == 1 &&
        layer >= c.num_hidden_layers) {
      ++mw.skipped_mtp_tensors;
      continue;
    }
    if (unknown++ == 0) first_unknown = name;
  }
  if (unknown)
    std::fprintf(stderr, "osprey: warning: %d tensors in %s are not used (first: %s)\n", unknown,
                 ckpt.path().c_str(), first_unknown.c_str());
}

ModelWeights load_weights_cpu(const Checkpoint& ckpt, const ModelConfig& c,
                              const std::vector<WeightSpec>& specs, const std::string& label) {
  ModelWeights mw;
  Loader loader(ckpt, mw);
  LoadProgress progress(label, int(ckpt.n_files()));
  std::map<std::string, LinearWeight> t;
  for (const WeightSpec& spec : in_checkpoint_order(ckpt, specs))
    t[spec.name] = LinearWeight{loader.load(spec, progress), {}};
  progress.done();
  assemble_weights(c, t, mw);
  report_unused(ckpt, c, loader.used(), mw, specs.size() < main_weight_specs(c).size());
  return mw;
}

ModelWeights load_weights_cpu(const Checkpoint& ckpt, const ModelConfig& c) {
  return load_weights_cpu(ckpt, c, weight_specs_for(ckpt, c), "osprey: loading weights");
}

}  // namespace osprey
