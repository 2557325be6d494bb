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
  // The expanded path's step: one sequence of min(budget, max_model_len) new tokens ending at
  // max_model_len (a step takes that path only while its Σ seq_lens ≤ max_model_len). The
  // absorbed path's: the whole budget, over as many sequences of max_model_len as it takes
  // (at most max_num_seqs), each ending at max_model_len — a budget above max_model_len is spent
  // on several prompts' chunks at once (H100, 2026-12-06: a 16384-token budget at max_model_len
  // 8192 profiled 8192 tokens, and the wave's first 16384-token step failed every request).
  const int64_t len = max_model_len;
  const int64_t total =
      std::min<int64_t>(max_num_batched_tokens, int64_t(max_num_seqs) * len);  // absorbed step
  const int64_t n_seqs = (total + len - 1) / len;
  const int64_t seq_blocks = (len + kBlockSize - 1) / kBlockSize;
  PagedKVCache cache = model.make_cache(seq_blocks * n_seqs);
  // Zeroed, so the earlier positions' keys are finite numbers (routing and top-k stay sane).
#ifdef OSPREY_WITH_CUDA  // the device helpers exist only in the CUDA build
  if (cache.device() == Device::CUDA) {
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      cuda::fill_bytes(cache.latent(l), 0);
      if (c.has_indexer) cuda::fill_bytes(cache.index_keys(l), 0);
    }
  } else
#endif
  {
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      Tensor t = cache.latent(l);
      std::fill_n(static_cast<char*>(t.data), t.nbytes(), 0);
      if (c.has_indexer) {
        Tensor k = cache.index_keys(l);
        std::fill_n(static_cast<char*>(k.data), k.nbytes(), 0);
      }
    }
  }
  // Sequence i: `tokens` new tokens ending at max_model_len, in blocks [i·seq_blocks, ...).
  auto seq = [&](int64_t i, int64_t tokens) {
    SeqStep s;
    s.start_pos = int32_t(len - tokens);
    s.tokens.resize(size_t(tokens));
    for (int64_t t = 0; t < tokens; ++t)
      s.tokens[size_t(t)] = int32_t(((i * len + t) * 7919) % c.vocab_size);
    for (int64_t b = 0; b < seq_blocks; ++b) s.blocks.push_back(int32_t(i * seq_blocks + b));
    s.all_logits = true;  // logits rows: the step's last max_num_seqs tokens (the sampler's peak)
    return s;
  };
  std::vector<SeqStep> wide;
  for (int64_t i = 0, left = total; i < n_seqs; ++i, left -= len)
    wide.push_back(seq(i, std::min(left, len)));
  const std::vector<SeqStep> narrow = {seq(0, std::min<int64_t>(max_num_batched_tokens, len))};
  const auto t0 = std::chrono::steady_clock::now();
  for (AttentionPath path : {AttentionPath::Expanded, AttentionPath::Absorbed}) {
    OwnedBatch owned(path == AttentionPath::Expanded ? narrow : wide, kBlockSize);
    ForwardBatch batch = owned.batch();
    const int64_t n = batch.attn.n_tokens;
    const int64_t n_logits = std::min<int64_t>(n, max_num_seqs);
    batch.logits_indices = batch.logits_indices.rows(n - n_logits, n);
    ForwardOptions o;
    o.path = path;
#ifdef OSPREY_WITH_CUDA  // DeviceBuffer exists only in the CUDA build
    if (model.device() == Device::CUDA) {
      DeviceBuffer logits(DType::F32, {n_logits, c.vocab_size});
      model.forward(batch, cache, logits, o);
      cuda::synchronize();
      continue;
    }
#endif
    Buffer logits(DType::F32, {n_logits, c.vocab_size});
    model.forward(batch, cache, logits, o);
  }
  // The workspace as a step will hold it: one arena of the high-water size. Without this the
  // last forward's overflow allocations stay beside the old arena until the next step's reset, and
  // the memory measured after the profile counts both (the 16384-token profile of the dsv32
  // proxy: 42.9 GiB, H100).
  model.settle_workspace();
  StepProfile p;
  p.tokens = total;
  p.sequences = n_seqs;
  p.context = max_model_len;
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

}  // namespace osprey
