// Expert parallelism: the routed experts partitioned over the ranks (expert e on rank
// e / (E / world)), each token's (token, expert) pairs sent to the experts' ranks and the
// weighted outputs sent back, both with all-to-all.
//
//   dispatch: this rank's tokens [tok_begin, tok_end) × top-k pairs, ordered by destination rank,
//             each as one row [x (D) | local expert id | routing weight]  → all_to_allv
//   experts:  the received rows through this rank's experts (one pair per row)
//   combine:  the [D] outputs back to their origin (all_to_allv), summed per token over k
//   TP + EP:  every rank holds all T tokens; rank r dispatches its share [r·chunk, (r+1)·chunk)
//             and the shares' outputs are all-gathered (padded to `chunk` rows) into `out`.
// The router's choices are used as given (topk_ids, topk_weights): the same experts and weights
// as one rank, only where they run differs.
// Routing is read on the host (one device→host copy of [T, k] ids and weights on the GPU).
#pragma once

#include <vector>

#include "core/storage.h"
#include "dist/communicator.h"
#include "model/shard.h"
#include "ops/moe.h"

namespace osprey {

// out [T, D] = Σ_k topk_weights[t, k] · expert_{topk_ids[t, k]}(x[t]) over every rank's experts.
void moe_expert_parallel(Tensor out, Tensor x, Tensor topk_ids, Tensor topk_weights,
                         const std::vector<MlpWeights>& experts, const RankShard& shard,
                         dist::Communicator& comm, int64_t tok_begin, int64_t tok_end,
                         int64_t chunk, Workspace& ws);

}  // namespace osprey
