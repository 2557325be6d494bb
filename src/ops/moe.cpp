// Router parameters from the config, and the host reference of the grouped experts' routing
// permutation and tile schedule (ops/moe_schedule.h).
#include "ops/moe.h"

#include "core/error.h"
#include "ops/moe_schedule.h"

namespace osprey {

RouterParams RouterParams::from_config(const ModelConfig& c) {
  RouterParams p;
  p.n_experts = c.n_routed_experts;
  p.top_k = c.num_experts_per_tok;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.scoring = c.scoring_func;
  p.method = c.topk_method;
  p.norm_topk_prob = c.norm_topk_prob;
  p.routed_scaling_factor = float(c.routed_scaling_factor);
  return p;
}

MoeSchedule moe_schedule_reference(const int32_t* ids, int64_t rows, int n_experts, int tile_rows) {
  OSPREY_CHECK(n_experts > 0 && rows >= 0 && rows < (int64_t(1) << 31) && tile_rows >= 1,
               "moe schedule: ", rows, " rows, ", n_experts, " experts, tiles of ", tile_rows);
  const size_t E = size_t(n_experts);
  MoeSchedule s;
  s.offsets.assign(E + 1, 0);
  s.tile_start.assign(E + 1, 0);
  for (int64_t i = 0; i < rows; ++i) {
    OSPREY_CHECK(ids[i] >= 0 && ids[i] < n_experts, "expert id ", ids[i], " of ", n_experts);
    ++s.offsets[size_t(ids[i]) + 1];
  }
  for (size_t e = 0; e < E; ++e) {
    const int32_t count = s.offsets[e + 1];
    s.offsets[e + 1] += s.offsets[e];
    s.tile_start[e + 1] = s.tile_start[e] + (count + tile_rows - 1) / tile_rows;
  }
  // Stable counting sort: i ascending lands at its expert's next free row.
  std::vector<int32_t> next(s.offsets.begin(), s.offsets.end() - 1);  // [E]
  s.perm.resize(size_t(rows));
  s.inv.resize(size_t(rows));
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t r = next[size_t(ids[i])]++;
    s.perm[size_t(r)] = int32_t(i);
    s.inv[size_t(i)] = r;
  }
  s.tiles.resize(size_t(moe_max_tiles(rows, n_experts, tile_rows)));
  OSPREY_CHECK(int64_t(s.tile_start[E]) <= int64_t(s.tiles.size()), "moe tile bound");
  for (size_t j = 0; j < s.tiles.size(); ++j)
    s.tiles[j] = moe_tile_at(int(j), s.tile_start.data(), s.offsets.data(), n_experts, tile_rows);
  return s;
}

}  // namespace osprey
