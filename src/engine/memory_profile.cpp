#include "engine/memory_profile.h"

#include <algorithm>
#include <chrono>

#include "core/device_buffer.h"
#include "core/error.h"
#include "kv/paged_cache.h"
#include "model/forward_batch.h"

namespace osprey {

StepProfile profile_step_memory(const DeepseekModel& model, int max_num_batched_tokens,
                                int max_model_len, int max_num_seqs) {
  if (max_num_batched_tokens <= 0 || max_model_len <= 0 || max_num_seqs <= 0)
    fail("profile_step_memory: max_num_batched_tokens ", max_num_batched_tokens, ", max_model_len ",
         max_model_len, " and max_num_seqs ", max_num_seqs, " must be positive");
  const ModelConfig& c = model.config();
  const int64_t chunk = std::min(max_num_batched_tokens, max_model_len);
  const int64_t start = int64_t(max_model_len) - chunk;
  const int64_t n_blocks = (int64_t(max_model_len) + kBlockSize - 1) / kBlockSize;
  PagedKVCache cache = model.make_cache(n_blocks);
  if (cache.device() == Device::CUDA) {
#ifdef OSPREY_WITH_CUDA
    // Zeroed, so the earlier positions' keys are finite numbers (routing and top-k stay sane).
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      cuda::fill_bytes(cache.latent(l), 0);
      if (c.has_indexer) cuda::fill_bytes(cache.index_keys(l), 0);
    }
#endif
  } else {
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      Tensor t = cache.latent(l);
      std::fill_n(static_cast<char*>(t.data), t.nbytes(), 0);
      if (c.has_indexer) {
        Tensor k = cache.index_keys(l);
        std::fill_n(static_cast<char*>(k.data), k.nbytes(), 0);
      }
    }
  }
  SeqStep s;
  s.start_pos = int32_t(start);
  s.tokens.resize(size_t(chunk));
  for (int64_t i = 0; i < chunk; ++i) s.tokens[size_t(i)] = int32_t((i * 7919) % c.vocab_size);
  for (int64_t b = 0; b < n_blocks; ++b) s.blocks.push_back(int32_t(b));
  s.all_logits = true;  // logits rows: the last max_num_seqs tokens (the sampler's peak)
  OwnedBatch owned({s}, kBlockSize);
  ForwardBatch batch = owned.batch();
  const int64_t n_logits = std::min<int64_t>(chunk, max_num_seqs);
  batch.logits_indices = batch.logits_indices.rows(chunk - n_logits, chunk);
  const auto t0 = std::chrono::steady_clock::now();
  // Both attention paths: the step may take either (DeepseekModel::set_max_expanded_kv_rows).
  for (AttentionPath path : {AttentionPath::Expanded, AttentionPath::Absorbed}) {
    ForwardOptions o;
    o.path = path;
    if (model.device() == Device::CUDA) {
#ifdef OSPREY_WITH_CUDA
      DeviceBuffer logits(DType::F32, {n_logits, c.vocab_size});
      model.forward(batch, cache, logits, o);
      cuda::synchronize();
#endif
    } else {
      Buffer logits(DType::F32, {n_logits, c.vocab_size});
      model.forward(batch, cache, logits, o);
    }
  }
  StepProfile p;
  p.tokens = chunk;
  p.context = max_model_len;
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

}  // namespace osprey
