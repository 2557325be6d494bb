// The host reference of the sm90 MLA split-KV plan (ops/mla_plan.h).
#include "ops/mla_plan.h"

#include "core/error.h"

namespace osprey::ops {

MlaPlanReference mla_plan_reference(const std::vector<int32_t>& positions, int64_t clamp,
                                    int n_parts, int32_t fixed) {
  OSPREY_CHECK(n_parts >= 1 && fixed >= 0, "mla plan: n_parts ", n_parts, ", fixed cost ", fixed);
  const int n = int(positions.size());
  MlaPlanReference r;
  r.cum.assign(size_t(n) + 1, 0);
  for (int t = 0; t < n; ++t) {
    r.cum[size_t(t) + 1] = r.cum[size_t(t)] + mla_token_blocks(positions[size_t(t)], clamp);
  }
  const int32_t payload = mla_plan_payload(r.cum[size_t(n)], n, fixed, n_parts);
  r.part_start.resize(size_t(n_parts) + 1);
  for (int p = 0; p <= n_parts; ++p)
    r.part_start[size_t(p)] = mla_part_start(p, r.cum.data(), n, fixed, n_parts, payload);
  r.first_part.resize(size_t(n));
  r.n_splits.resize(size_t(n));
  r.split_base.assign(size_t(n) + 1, 0);
  for (int t = 0; t < n; ++t) {
    const int f = mla_part_of(r.part_start.data(), n_parts, r.cum[size_t(t)]);
    const int l = mla_part_of(r.part_start.data(), n_parts, r.cum[size_t(t) + 1] - 1);
    r.first_part[size_t(t)] = f;
    r.n_splits[size_t(t)] = l - f + 1;
    r.split_base[size_t(t) + 1] = r.split_base[size_t(t)] + (l > f ? l - f + 1 : 0);
    if (l > f) r.split_tokens.push_back(t);
  }
  return r;
}

}  // namespace osprey::ops
