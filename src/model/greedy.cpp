#include "model/greedy.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "core/error.h"
#ifdef OSPREY_WITH_CUDA
#include "core/device_buffer.h"
#endif
#include "model/safetensors.h"

namespace osprey {

std::unique_ptr<DeepseekModel> load_model_cpu(const std::string& dir, const ModelConfig* config) {
  ModelConfig c = config ? *config : ModelConfig::from_file(dir);
  Checkpoint ck(dir);
  ModelWeights w = load_weights_cpu(ck, c);
  return std::make_unique<DeepseekModel>(std::move(c), std::move(w));
}

std::unique_ptr<DeepseekModel> load_model_cuda(const std::string& dir, const ModelConfig* config) {
#ifdef OSPREY_WITH_CUDA
  cuda::require_device();
#endif
  ModelConfig c = config ? *config : ModelConfig::from_file(dir);
  Checkpoint ck(dir);
  ModelWeights w = load_weights_cuda(ck, c);
  return std::make_unique<DeepseekModel>(std::move(c), std::move(w));
}

std::unique_ptr<DeepseekModel> load_model(const std::string& dir, Device device,
                                          const ModelConfig* config) {
  return device == Device::CPU ? load_model_cpu(dir, config) : load_model_cuda(dir, config);
}

namespace {
std::vector<int32_t> first_blocks(int64_t tokens) {
  std::vector<int32_t> b(size_t((tokens + kBlockSize - 1) / kBlockSize));
  std::iota(b.begin(), b.end(), 0);
  return b;
}

void check_prompt(const DeepseekModel& m, size_t n, int extra) {
  if (n == 0) fail("the prompt is empty");
  if (int64_t(n) + extra > m.config().max_position_embeddings)
    fail("prompt of ", n, " tokens plus ", extra, " new tokens exceeds max_position_embeddings (",
         m.config().max_position_embeddings, ")");
}
}  // namespace

Buffer prefill_logits(const DeepseekModel& m, const std::vector<int32_t>& tokens,
                      const ForwardOptions& opts) {
  check_prompt(m, tokens.size(), 0);
  const std::vector<int32_t> blocks = first_blocks(int64_t(tokens.size()));
  PagedKVCache cache = m.make_cache(int64_t(blocks.size()));
  OwnedBatch b({SeqStep{tokens, 0, blocks, true}}, kBlockSize);
  Buffer logits(DType::F32, {int64_t(tokens.size()), m.config().vocab_size});
  m.forward(b.batch(), cache, logits, opts);
  return logits;
}

std::vector<int32_t> greedy_generate(const DeepseekModel& m, const std::vector<int32_t>& prompt,
                                     const GreedyOptions& o) {
  check_prompt(m, prompt.size(), o.max_new_tokens);
  const int V = m.config().vocab_size;
  const std::vector<int32_t> blocks = first_blocks(int64_t(prompt.size()) + o.max_new_tokens);
  PagedKVCache cache = m.make_cache(int64_t(blocks.size()));
  Buffer logits(DType::F32, {1, V});
  auto argmax = [&]() {
    const float* l = logits.f32();
    return int32_t(std::max_element(l, l + V) - l);
  };
  const size_t chunk = o.prefill_chunk > 0 ? size_t(o.prefill_chunk) : prompt.size();
  for (size_t start = 0; start < prompt.size(); start += chunk) {
    const size_t end = std::min(prompt.size(), start + chunk);
    OwnedBatch b({SeqStep{{prompt.begin() + long(start), prompt.begin() + long(end)},
                          int32_t(start),
                          blocks,
                          false}},
                 kBlockSize);
    m.forward(b.batch(), cache, logits, {o.prefill_path, nullptr, nullptr, {}});
  }
  std::vector<int32_t> out;
  int32_t pos = int32_t(prompt.size());
  while (int(out.size()) < o.max_new_tokens) {
    const int32_t next = argmax();
    out.push_back(next);
    if (o.stop_at_eos && next == m.config().eos_token_id) break;
    if (int(out.size()) == o.max_new_tokens) break;
    OwnedBatch b({SeqStep{{next}, pos++, blocks, false}}, kBlockSize);
    m.forward(b.batch(), cache, logits, {o.decode_path, nullptr, nullptr, {}});
  }
  return out;
}

std::vector<int32_t> parse_token_ids(const std::string& s, int vocab) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t\n"), e = item.find_last_not_of(" \t\n");
    if (b == std::string::npos) fail("empty entry in the token list '", s, "'");
    item = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size()) fail("'", item, "' is not a token id");
    if (v < 0 || v >= vocab) fail("token id ", v, " is outside the vocabulary [0, ", vocab, ")");
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) fail("no token ids given");
  return ids;
}

}  // namespace osprey
