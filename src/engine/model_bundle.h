// A servable model folder: the weights, and (when the folder has a tokenizer.json) the tokenizer
// and the chat format. What `osprey generate` and `osprey serve` load.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dist/parallel_config.h"
#include "model/deepseek.h"
#include "model/rank_group.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace osprey {

struct ModelBundleOptions {
  std::string chat_format = "auto";  // auto | deepseek-v3 | deepseek-v3.1 | simple
  bool dummy_weights = false;        // random weights from config.json (no safetensors needed)
  Device device = Device::CPU;       // where the model runs (CUDA: weights as load_weights_cuda)
  uint64_t dummy_seed = 0;
  dist::ParallelConfig parallel;  // more than one rank: the model is rank 0 of a RankGroup
};

struct ModelBundle {
  std::string dir;
  std::unique_ptr<RankGroup> group;      // the parallel model's ranks (before `model`: outlives it)
  std::unique_ptr<DeepseekModel> model;  // null in a process without rank 0 (see group)
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;  // null when the folder has none
  std::unique_ptr<tokenizer::ChatEncoder> chat;     // null without a tokenizer

  // Encodes chat messages, or fails saying the model has no tokenizer.
  std::vector<int32_t> encode_chat(const std::vector<tokenizer::ChatMessage>& messages,
                                   const tokenizer::ChatOptions& options) const;
  // Encodes a plain prompt (with the tokenizer's bos when it adds one).
  std::vector<int32_t> encode_text(const std::string& text) const;
};

ModelBundle load_model_bundle(const std::string& dir, const ModelBundleOptions& options = {});

}  // namespace osprey
