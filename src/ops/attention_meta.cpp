// attention_fingerprint (ops/attention_meta.h): xxh64 over the plan's inputs, on the host.
#include "ops/attention_meta.h"

#include <xxhash.h>

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace osprey {

uint64_t attention_fingerprint(const AttentionMeta& m, int64_t clamp) {
  OSPREY_CHECK(m.positions.device == Device::CPU && m.query_start_loc.device == Device::CPU,
               "attention_fingerprint reads host metadata");
  const int32_t* pos = m.positions.ptr<int32_t>();
  const int32_t* qsl = m.query_start_loc.ptr<int32_t>();
  int32_t max_q = 0;
  for (int s = 0; s < m.n_seqs; ++s) max_q = std::max(max_q, qsl[s + 1] - qsl[s]);
  std::vector<int64_t> words;
  words.reserve(size_t(m.n_tokens) + 3);
  words.push_back(m.n_tokens);
  words.push_back(max_q);
  words.push_back(clamp);
  for (int t = 0; t < m.n_tokens; ++t)
    words.push_back(std::min<int64_t>(int64_t(pos[t]) + 1, clamp));
  const uint64_t h = XXH64(words.data(), words.size() * sizeof(int64_t), 0x6f73707265790001ull);
  return h ? h : 1;
}

}  // namespace osprey
